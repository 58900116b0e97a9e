"""Paged attention over a mixed batch: decodes first (one batched kernel), then prefill chunks.

`AttentionMetadata` describes the flattened batch built by the model runner: token t of the batch
is written to cache slot `slot_mapping[t]`; the first `num_decode_tokens` tokens are single-token
decodes; each `PrefillChunk` is a run of query tokens of one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from instrumented_engine.kernels import KernelBackend
from instrumented_engine.kernels.reference import causal_attention, paged_prefill_attention_ref


@dataclass(frozen=True)
class PrefillChunk:
    q_start: int
    q_end: int
    context_len: int  # tokens of KV after this chunk, including it
    block_table: torch.Tensor  # (num_blocks,) covering context_len


@dataclass(frozen=True)
class AttentionMetadata:
    slot_mapping: torch.Tensor  # (T,)
    num_decode_tokens: int = 0
    decode_block_tables: torch.Tensor | None = None  # (Bd, max_blocks)
    decode_seq_lens: torch.Tensor | None = None  # (Bd,)
    prefills: list[PrefillChunk] = field(default_factory=list)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    backend: KernelBackend,
) -> torch.Tensor:
    """q (T, H, D), k/v (T, KVH, D): store k/v in the cache, attend, return (T, H, D)."""
    backend.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    nd = meta.num_decode_tokens
    if not meta.prefills:
        return backend.paged_decode_attention(
            q, k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale
        )
    out = torch.empty_like(q)
    if nd:
        out[:nd] = backend.paged_decode_attention(
            q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_seq_lens, scale
        )
    kvh = k.shape[1]
    for p in meta.prefills:
        qs = q[p.q_start : p.q_end]
        if p.context_len == qs.shape[0]:  # nothing earlier in the cache: attend over the chunk itself
            ks = k[p.q_start : p.q_end].transpose(0, 1)
            vs = v[p.q_start : p.q_end].transpose(0, 1)
            out[p.q_start : p.q_end] = causal_attention(qs, ks, vs, scale, kvh=kvh, offset=0)
        else:
            out[p.q_start : p.q_end] = paged_prefill_attention_ref(
                qs, k_cache, v_cache, p.block_table, p.context_len, scale
            )
    return out
