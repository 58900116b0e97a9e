"""Paged attention: the torch reference against a naive oracle, and the Triton kernels against the
reference (on CPU under TRITON_INTERPRET=1), across block sizes, GQA ratios and ragged lengths."""

from __future__ import annotations

import math

import pytest
import torch

from instrumented_engine.kernels.reference import (
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)
from instrumented_engine.kernels.triton_attention import paged_decode_attention_triton, store_kv_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_paged(seq_lens, block_size, kvh, d, seed=0, dtype=torch.float32):
    """A cache holding each sequence's K/V in shuffled blocks, plus the dense K/V for the oracle."""
    g = torch.Generator().manual_seed(seed)
    tables, dense = [], []
    num_blocks = 1 + sum(-(-n // block_size) for n in seq_lens)
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0 stays the null block
    k_cache = torch.zeros(num_blocks, block_size, kvh, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    for n in seq_lens:
        blocks = [perm.pop() for _ in range(-(-n // block_size))]
        k = torch.randn(n, kvh, d, generator=g, dtype=dtype)
        v = torch.randn(n, kvh, d, generator=g, dtype=dtype)
        slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(n)])
        store_kv_ref(k, v, k_cache, v_cache, slots)
        tables.append(blocks)
        dense.append((k, v))
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    return k_cache, v_cache, block_tables, dense


def naive_attention(q, k, v, scale, offset):
    """q (Tq, H, D) at positions offset.. over k, v (L, KVH, D), one query at a time."""
    h, kvh = q.shape[1], k.shape[1]
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        visible = offset + i + 1
        for head in range(h):
            kk = k[:visible, head // (h // kvh)]
            vv = v[:visible, head // (h // kvh)]
            w = torch.softmax((kk @ q[i, head]) * scale, dim=0)
            out[i, head] = w @ vv
    return out


@pytest.mark.parametrize("block_size,h,kvh", [(16, 9, 3), (8, 4, 4), (4, 8, 1)])
def test_reference_decode_matches_naive(block_size, h, kvh):
    lens = [1, 5, block_size, 3 * block_size + 2]
    d = 16
    k_cache, v_cache, tables, dense = random_paged(lens, block_size, kvh, d)
    q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(1))
    out = paged_decode_attention_ref(q, k_cache, v_cache, tables, torch.tensor(lens), 1 / math.sqrt(d))
    for i, (k, v) in enumerate(dense):
        want = naive_attention(q[i : i + 1], k, v, 1 / math.sqrt(d), offset=lens[i] - 1)
        torch.testing.assert_close(out[i : i + 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("context,tq", [(20, 20), (37, 5), (16, 16), (33, 1)])
def test_reference_prefill_matches_naive(context, tq):
    block_size, h, kvh, d = 8, 6, 2, 16
    k_cache, v_cache, tables, dense = random_paged([context], block_size, kvh, d)
    q = torch.randn(tq, h, d, generator=torch.Generator().manual_seed(2))
    nb = -(-context // block_size)
    out = paged_prefill_attention_ref(q, k_cache, v_cache, tables[0, :nb], context, 1 / math.sqrt(d))
    want = naive_attention(q, *dense[0], 1 / math.sqrt(d), offset=context - tq)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "block_size,h,kvh,d,lens",
    [
        (16, 9, 3, 64, [1, 17, 40, 100]),  # SmolLM2's shape, GQA 3:1
        (8, 8, 8, 32, [3, 8, 9, 31]),  # no GQA
        (32, 16, 2, 64, [64, 1, 33]),  # GQA 8:1
        (4, 4, 1, 16, [2, 13]),  # MQA, tiny blocks
    ],
)
def test_triton_decode_matches_reference(block_size, h, kvh, d, lens):
    k_cache, v_cache, tables, _ = random_paged(lens, block_size, kvh, d, seed=3)
    q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(4))
    seq_lens = torch.tensor(lens)
    scale = 1 / math.sqrt(d)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, scale)
    args = [x.to(DEVICE) for x in (q, k_cache, v_cache, tables, seq_lens)]
    got = paged_decode_attention_triton(*args, scale)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)


def test_triton_decode_bfloat16_cache():
    lens = [5, 30]
    k_cache, v_cache, tables, _ = random_paged(lens, 16, 3, 64, seed=5, dtype=torch.bfloat16)
    q = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, torch.tensor(lens), 0.125)
    got = paged_decode_attention_triton(
        *[x.to(DEVICE) for x in (q, k_cache, v_cache, tables, torch.tensor(lens))], 0.125
    )
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kvh,d", [(3, 64), (2, 24)])
def test_triton_store_matches_reference_and_skips_negative_slots(kvh, d):
    g = torch.Generator().manual_seed(7)
    k = torch.randn(6, kvh, d, generator=g)
    v = torch.randn(6, kvh, d, generator=g)
    slots = torch.tensor([5, 0, 17, 3, -1, 30])
    ref_k, ref_v = torch.zeros(4, 8, kvh, d), torch.zeros(4, 8, kvh, d)
    keep = slots >= 0
    store_kv_ref(k[keep], v[keep], ref_k, ref_v, slots[keep])
    tk, tv = torch.zeros_like(ref_k).to(DEVICE), torch.zeros_like(ref_v).to(DEVICE)
    store_kv_triton(k.to(DEVICE), v.to(DEVICE), tk, tv, slots.to(DEVICE))
    assert torch.equal(tk.cpu(), ref_k) and torch.equal(tv.cpu(), ref_v)


def test_triton_launcher_rejects_mismatched_shapes():
    k_cache = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="do not match"):
        paged_decode_attention_triton(
            torch.zeros(1, 3, 8),
            k_cache,
            k_cache.clone(),
            torch.zeros(1, 1, dtype=torch.long),
            torch.ones(1, dtype=torch.long),
            1.0,
        )
