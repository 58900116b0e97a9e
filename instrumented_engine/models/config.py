"""The decoder's shape, read from a GGUF header or a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "llama",
}


@dataclass(frozen=True)
class ModelConfig:
    """Llama-family decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")

    def kv_bytes_per_token(self, element_size: int) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * element_size

    @classmethod
    def from_hf_config(cls, cfg: dict) -> ModelConfig:
        """Raises ValueError for architectures or RoPE scalings this decoder does not implement."""
        archs = cfg.get("architectures") or []
        arch = next((SUPPORTED_HF_ARCHITECTURES[a] for a in archs if a in SUPPORTED_HF_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"unsupported model architecture {archs or cfg.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_HF_ARCHITECTURES)}"
            )
        scaling = cfg.get("rope_scaling")
        if scaling and (scaling.get("rope_type") or scaling.get("type")) not in (None, "default"):
            raise ValueError(f"unsupported rope_scaling {scaling!r}: only plain RoPE is implemented")
        if cfg.get("sliding_window") and cfg.get("use_sliding_window"):
            raise ValueError("sliding-window attention is not supported")
        heads = cfg["num_attention_heads"]
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=cfg.get("rope_theta", 10000.0),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=cfg.get("tie_word_embeddings", False),
            attention_bias=arch == "qwen2" or cfg.get("attention_bias", False),
        )
