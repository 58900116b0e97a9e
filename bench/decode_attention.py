"""Paged decode attention on the CPU: the C++ kernel (reads the paged cache in place) against the pure-torch
reference (gathers the blocks, then matmuls), on SmolLM2's shape (9 query heads, 3 KV heads, 64 dims, 16-token
blocks) at a few batch sizes and context lengths, interleaved in one process; median of `--repeats`.

    python bench/decode_attention.py [--dtype float32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from results import Result, record  # bench/ is on sys.path when a script in it runs

from instrumented_engine.kernels.cpu_kernels import load_decode
from instrumented_engine.kernels.reference import paged_decode_attention_ref

SHAPES = ((1, 300), (16, 400), (64, 1000))  # (sequences, context tokens)
HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


def case(batch: int, context: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(batch * 1000 + context)
    blocks = -(-context // BLOCK)
    k_cache = torch.randn(batch * blocks + 1, BLOCK, KV_HEADS, DIM, generator=g).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=g).to(dtype)
    tables = torch.randperm(batch * blocks, generator=g).view(batch, blocks) + 1  # shuffled, as a real cache is
    lens = torch.randint(context - 60, context + 1, (batch,), generator=g).clamp(min=1)
    q = torch.randn(batch, HEADS, DIM, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, lens, DIM**-0.5


def timed(fn, args, calls: int = 20) -> float:
    for _ in range(3):
        fn(*args)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e3


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    kernel, why = load_decode()
    if kernel is None:
        raise SystemExit(f"no C++ kernel: {why}")
    dtype = getattr(torch, args.dtype)
    print(f"\n{args.dtype}, {torch.get_num_threads()} threads; ms per call (one layer), median of {args.repeats}")
    print(f"{'sequences x context':>20} {'torch reference':>16} {'C++ kernel':>11} {'speed-up':>9}")
    results = []
    for batch, context in SHAPES:
        args_ = case(batch, context, dtype)
        ref, cpp = [], []
        for _ in range(args.repeats):  # interleaved: drift on a shared machine hits both alike
            ref.append(timed(paged_decode_attention_ref, args_))
            cpp.append(timed(kernel, args_))
        r, c = statistics.median(ref), statistics.median(cpp)
        print(f"{f'{batch} x {context}':>20} {r:16.3f} {c:11.3f} {r / c:8.2f}x")
        results.append(
            Result(
                "decode_attention",
                f"C++ kernel, {batch} x {context}, {args.dtype}",
                c,
                "ms",
                r / c,
                "torch reference (speed-up)",
            )
        )
    return results


if __name__ == "__main__":
    record(main)
