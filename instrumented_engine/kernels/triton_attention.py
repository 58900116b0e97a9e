"""Triton kernels: paged decode attention and the KV store, each with a checked launcher.

They run on CUDA tensors, and on CPU tensors under the Triton interpreter (`TRITON_INTERPRET=1`),
which is how the tests compare them with `kernels.reference`. Math is in float32 with an online
softmax over the sequence's blocks (one program per (sequence, KV head), serving the head's group
of query heads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    out_ptr,
    scale,
    stride_qb,
    stride_qh,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_bt,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    GROUP_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P2: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, GROUP_P2)
    d = tl.arange(0, HEAD_DIM_P2)
    t = tl.arange(0, BLOCK_SIZE)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q = (
        tl.load(
            q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        * scale
    )  # (G, D)
    m = tl.full([GROUP_P2], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_P2], tl.float32)
    acc = tl.zeros([GROUP_P2, HEAD_DIM_P2], tl.float32)
    for i in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        block = tl.load(block_tables_ptr + seq * stride_bt + i)
        t_mask = i * BLOCK_SIZE + t < seq_len
        offs = block * stride_cb + t[:, None] * stride_ct + kv_head * stride_ch + d[None, :]
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)  # (BS, D)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # (G, BS)
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        denom = denom * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / denom[:, None]
    tl.store(
        out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_mask[:, None] & d_mask[None, :],
    )


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    stride_kt,
    stride_vt,
    ROW: tl.constexpr,
    ROW_P2: tl.constexpr,
):
    token = tl.program_id(0)
    i = tl.arange(0, ROW_P2)
    slot = tl.load(slot_ptr + token + i * 0)  # the token's slot, broadcast over the row
    mask = (i < ROW) & (slot >= 0)
    k = tl.load(k_ptr + token * stride_kt + i, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + i, mask=mask)
    tl.store(k_cache_ptr + slot * ROW + i, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + slot * ROW + i, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(
            f"k/v caches must share a (blocks, block_size, kv_heads, head_dim) shape; "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k/v caches must be contiguous")


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as `reference.paged_decode_attention_ref`: q (B, H, D) -> (B, H, D)."""
    _check_cache(k_cache, v_cache)
    b, h, d = q.shape
    _, block_size, kvh, cache_d = k_cache.shape
    if cache_d != d or h % kvh:
        raise ValueError(f"q heads {h} x dim {d} do not match cache kv heads {kvh} x dim {cache_d}")
    if block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError("block_tables and seq_lens must have one row per query")
    q = q.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(q)
    group = h // kvh
    _paged_decode_kernel[(b, kvh)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        GROUP=group,
        GROUP_P2=triton.next_power_of_2(group),
        BLOCK_SIZE=block_size,
        HEAD_DIM=d,
        HEAD_DIM_P2=triton.next_power_of_2(d),
    )
    return out


def store_kv_triton(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Same contract as `reference.store_kv_ref`; slots < 0 are skipped."""
    _check_cache(k_cache, v_cache)
    t, kvh, d = k.shape
    if k.shape != v.shape or k_cache.shape[2:] != (kvh, d) or slot_mapping.shape != (t,):
        raise ValueError(
            f"k/v {tuple(k.shape)} do not match cache rows {tuple(k_cache.shape[2:])} "
            f"or slot_mapping {tuple(slot_mapping.shape)}"
        )
    k = k.reshape(t, kvh * d)
    v = v.reshape(t, kvh * d)
    if k.stride(1) != 1 or v.stride(1) != 1:
        k, v = k.contiguous(), v.contiguous()
    row = kvh * d
    _store_kv_kernel[(t,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.contiguous(),
        k.stride(0),
        v.stride(0),
        ROW=row,
        ROW_P2=triton.next_power_of_2(row),
    )
