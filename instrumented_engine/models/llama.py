"""A Llama-family decoder (Llama, SmolLM2, Qwen2 shapes) over a paged KV cache.

Reads bottom-up: attention and MLP blocks, a decoder layer, the model. Activations are flattened
over the batch: (T, hidden) for T tokens of possibly many sequences; `AttentionMetadata` tells
paged attention which tokens belong together. QKV and gate/up projections are fused; weights load
under Hugging Face names (`load_weights`), which the GGUF loader maps to.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from instrumented_engine.kernels import KernelBackend
from instrumented_engine.layers.attention import AttentionMetadata, paged_attention
from instrumented_engine.layers.norm import RMSNorm
from instrumented_engine.layers.rotary import RotaryEmbedding
from instrumented_engine.models.config import ModelConfig


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rotary: RotaryEmbedding,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        backend: KernelBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        backend.ops.rotary_(qkv, positions, rotary.cos_sin, self.num_heads + self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)  # (T, H, D)
        k = k.view(t, self.num_kv_heads, self.head_dim)  # (T, KVH, D)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, backend)
        return self.o_proj(out.reshape(t, self.q_size))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return self.down_proj(backend.ops.silu_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, positions, rotary, kv_cache, meta, backend) -> torch.Tensor:
        ops, eps = backend.ops, self.input_layernorm.eps
        attn = self.self_attn(
            ops.rms_norm(x, self.input_layernorm.weight, eps), positions, rotary, kv_cache, meta, backend
        )
        normed, x = ops.add_rms_norm(x, attn, self.post_attention_layernorm.weight, eps)
        return x + self.mlp(normed, backend)


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    # HF name fragment -> (fused parameter, shard index)
    _packed = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        backend: KernelBackend,
    ) -> torch.Tensor:
        """input_ids, positions (T,) -> final hidden states (T, hidden)."""
        x = self.model.embed_tokens(input_ids)
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            x = layer(x, positions, self.rotary, kv_cache, meta, backend)
        return self.model.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors into the (fused) parameters; every parameter must be set."""
        params = dict(self.named_parameters())
        missing = set(params)
        cfg = self.config
        shard_sizes = {
            "qkv_proj": [cfg.num_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2,
            "gate_up_proj": [cfg.intermediate_size] * 2,
        }
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue
            target, shard = name, None
            for frag, (fused, index) in self._packed.items():
                if f".{frag}." in name:
                    target, shard = name.replace(frag, fused), index
                    break
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in this model")
            param = params[target]
            with torch.no_grad():
                if shard is None:
                    _copy_checked(param, tensor, name)
                else:
                    sizes = shard_sizes[target.split(".")[-2]]
                    begin = sum(sizes[:shard])
                    _copy_checked(param.narrow(0, begin, sizes[shard]), tensor, name)
            if shard is None or shard == len(shard_sizes[target.split(".")[-2]]) - 1:
                missing.discard(target)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
            missing.discard("lm_head.weight")
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def _copy_checked(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"tensor {name!r} has shape {tuple(src.shape)}; the model expects {tuple(dst.shape)}")
    dst.copy_(src)
