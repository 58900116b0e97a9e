"""Pure-torch paged attention and KV store: the CPU path and the oracle for the Triton kernels.

Cache layout (per layer): k_cache, v_cache of shape (num_blocks, block_size, num_kv_heads, head_dim).
A token at position p of a sequence lives in block `block_table[p // block_size]`, row
`p % block_size`; its flat slot is `block_id * block_size + p % block_size`.
"""

from __future__ import annotations

import torch


def store_kv_ref(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write k, v (T, KVH, D) into the caches at flat slots `slot_mapping` (T,)."""
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    k_cache.view(num_slots, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(num_slots, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """(B, max_blocks) block ids -> (B, KVH, max_blocks * block_size, D) contiguous keys or values."""
    b, nb = block_tables.shape
    x = cache[block_tables]  # (B, nb, bs, KVH, D)
    return x.reshape(b, nb * cache.shape[1], cache.shape[2], cache.shape[3]).transpose(1, 2)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence over its whole paged context.

    Args:
        q: (B, H, D) queries; H must be a multiple of the cache's KVH (grouped-query attention).
        block_tables: (B, max_blocks) int block ids; entries past a sequence's length are ignored.
        seq_lens: (B,) context lengths including the query token.
    Returns:
        (B, H, D) attention output in q's dtype.
    """
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    k = gather_kv(k_cache, block_tables).float()  # (B, KVH, L, D)
    v = gather_kv(v_cache, block_tables).float()
    qg = q.float().view(b, kvh, h // kvh, d)  # (B, KVH, G, D)
    scores = torch.matmul(qg, k.transpose(-1, -2)) * scale  # (B, KVH, G, L)
    valid = torch.arange(k.shape[2], device=q.device)[None, :] < seq_lens[:, None]  # (B, L)
    scores.masked_fill_(~valid[:, None, None, :], float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # (B, KVH, G, D)
    return out.reshape(b, h, d).to(q.dtype)


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one sequence's last q.shape[0] tokens over its first `context_len` tokens.

    Args:
        q: (Tq, H, D) queries at positions context_len - Tq .. context_len - 1.
        block_table: (num_blocks,) block ids covering `context_len` tokens.
    Returns:
        (Tq, H, D).
    """
    tq, h, d = q.shape
    kvh = k_cache.shape[2]
    k = gather_kv(k_cache, block_table[None])[0, :, :context_len]  # (KVH, L, D)
    v = gather_kv(v_cache, block_table[None])[0, :, :context_len]
    return causal_attention(q, k, v, scale, kvh=kvh, offset=context_len - tq)


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *, kvh: int, offset: int
) -> torch.Tensor:
    """q (Tq, H, D) at positions offset.. over k, v (KVH, L, D); returns (Tq, H, D).

    Called with a batch dimension and `enable_gqa` (head i reads KV head i // (H / KVH)): on the CPU, 4-D inputs
    take torch's flash-attention kernel, while 3-D ones fall back to the slower unfused math path (the figures:
    this function's commit)."""
    tq, h, d = q.shape
    qh = q.transpose(0, 1)[None]  # (1, H, Tq, D)
    k, v = k.to(q.dtype)[None], v.to(q.dtype)[None]
    if offset == 0:
        out = torch.nn.functional.scaled_dot_product_attention(
            qh, k, v, is_causal=True, scale=scale, enable_gqa=kvh != h
        )
    else:
        rows = torch.arange(tq, device=q.device)[:, None] + offset
        mask = torch.arange(k.shape[2], device=q.device)[None, :] <= rows  # (Tq, L)
        out = torch.nn.functional.scaled_dot_product_attention(
            qh, k, v, attn_mask=mask, scale=scale, enable_gqa=kvh != h
        )
    return out[0].transpose(0, 1)
