"""Turns a scheduled batch into tensors, runs the model, and samples.

Owns the model and the paged KV cache: per layer, K and V tensors of shape
(num_blocks, block_size, num_kv_heads, head_dim), preallocated once. The batch is flattened with
single-token decodes first (one batched paged-attention call) and prefill chunks after.
"""

from __future__ import annotations

import logging

import torch

from instrumented_engine.config import CacheLayout
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
        log.info(
            "KV cache: %d blocks x %d tokens, %.1f MiB, kernels=%s, linears: %s",
            layout.num_blocks,
            layout.block_size,
            layout.num_blocks * layout.bytes_per_block / 2**20,
            self.backend.name,
            self.linears,
        )

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
