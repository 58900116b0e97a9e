"""Turns a scheduled batch into tensors, runs the model, and samples.

Owns the model and the paged KV cache: per layer, K and V tensors of shape
(num_blocks, block_size, num_kv_heads, head_dim), preallocated once. The batch is flattened with
single-token decodes first (one batched paged-attention call) and prefill chunks after.
"""

from __future__ import annotations

import logging
import time

import torch

from instrumented_engine.config import CacheLayout
from instrumented_engine.engine.kv_cache.offload import TierCopy
from instrumented_engine.engine.scheduler import ScheduledSeq, SchedulerOutput
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.kernels import select_backend
from instrumented_engine.layers.attention import AttentionMetadata, PrefillChunk
from instrumented_engine.layers.linear import can_prepack, prepack_linears
from instrumented_engine.layers.sampler import sample
from instrumented_engine.models.llama import LlamaForCausalLM
from instrumented_engine.models.loader import ModelSource

log = logging.getLogger(__name__)


class ModelRunner:
    def __init__(
        self,
        source: ModelSource,
        layout: CacheLayout,
        *,
        dtype: torch.dtype,
        device: torch.device,
        progress: bool = True,
        batch_hint: int = 16,
    ) -> None:
        self.layout = layout
        self.dtype, self.device = dtype, device
        self.backend = select_backend(device)
        cfg = source.config
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
        model = model.to_empty(device=device).to(dtype)
        model.load_weights(source.tensors(progress=progress))
        model.rotary.build(device)
        packable, why_not = can_prepack(device, dtype)
        packed = prepack_linears(model, batch_hint) if packable else 0
        self.linears = f"{packed} prepacked (oneDNN)" if packed else f"nn.Linear ({why_not})"
        self.model = model.eval()
        shape = (layout.num_blocks, layout.block_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_layers)
        ]
        self.tier_caches = self._tier_caches(layout.num_offload_blocks, shape[1:], cfg.num_layers)
        log.info(
            "KV cache: %d blocks x %d tokens, %.1f MiB, kernels=%s, linears: %s",
            layout.num_blocks,
            layout.block_size,
            layout.num_blocks * layout.bytes_per_block / 2**20,
            self.backend.name,
            self.linears,
        )

    def _tier_caches(self, num_blocks: int, block_shape: tuple, num_layers: int) -> list[tuple[torch.Tensor, ...]]:
        """The offload tier's KV in host memory (pinned when the cache is on a GPU, as vLLM's), per layer."""
        if not num_blocks:
            return []
        pin = self.device.type == "cuda"
        log.info(
            "offload tier (CPU): %d blocks, %.1f MiB", num_blocks, num_blocks * self.layout.bytes_per_block / 2**20
        )
        shape = (num_blocks, *block_shape)
        return [
            tuple(torch.zeros(shape, dtype=self.dtype, device="cpu", pin_memory=pin) for _ in range(2))
            for _ in range(num_layers)
        ]

    @torch.inference_mode()
    def copy_tier(self, copy: TierCopy, *, load: bool) -> tuple[int, float]:
        """Copy one request's blocks from the tier into the cache (`load`) or from the cache into the tier: the bytes
        moved and the seconds it took (the copy's own cost, synchronized on a GPU)."""
        begin = time.perf_counter()
        cache_ids = torch.tensor(copy.block_ids, dtype=torch.long, device=self.device)
        slots = torch.tensor(copy.slots, dtype=torch.long)
        for cache_pair, tier_pair in zip(self.kv_caches, self.tier_caches):
            for cache, tier in zip(cache_pair, tier_pair):
                if load:
                    cache.index_copy_(0, cache_ids, tier.index_select(0, slots).to(self.device, non_blocking=True))
                else:
                    tier.index_copy_(0, slots, cache.index_select(0, cache_ids).to("cpu"))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return len(copy.block_ids) * self.layout.bytes_per_block, time.perf_counter() - begin

    @torch.inference_mode()
    def run(self, batch: SchedulerOutput, generators: dict[str, torch.Generator]) -> dict[str, int | Exception]:
        """Run one step; returns the sampled token per request id for chunks that reach the end (the exception for a
        request whose sampling failed)."""
        items = sorted(batch.scheduled, key=lambda s: s.num_new_tokens != 1)  # decodes first, stable
        input_ids, positions, meta, sample_rows = self._prepare(items)
        hidden = self.model(input_ids, positions, self.kv_caches, meta, self.backend)
        if not sample_rows:
            return {}
        rows = torch.tensor([row for row, _ in sample_rows], device=self.device)
        logits = self.model.compute_logits(hidden[rows])
        seqs = [s for _, s in sample_rows]
        tokens = sample(logits, [s.sampling_params for s in seqs], [generators.get(s.request_id) for s in seqs])
        return {s.request_id: t for s, t in zip(seqs, tokens)}

    def _prepare(self, items: list[ScheduledSeq]):
        bs = self.layout.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[tuple[int, Sequence]] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        for item in items:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            q_start = len(ids)
            ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            context_len = start + n
            if n == 1:
                decode_tables.append(table[: -(-context_len // bs)])
                decode_lens.append(context_len)
            else:
                block_table = torch.tensor(table[: -(-context_len // bs)], dtype=torch.long, device=self.device)
                prefills.append(PrefillChunk(q_start, q_start + n, context_len, block_table))
            if item.samples:
                sample_rows.append((q_start + n - 1, seq))
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            num_decode_tokens=len(decode_lens),
            decode_block_tables=_pad(decode_tables, dev) if decode_tables else None,
            decode_seq_lens=torch.tensor(decode_lens, dtype=torch.long, device=dev) if decode_lens else None,
            prefills=prefills,
        )
        return (
            torch.tensor(ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta,
            sample_rows,
        )


def _pad(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """Pad block tables with the null block 0 into (B, max_blocks)."""
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=device)
