"""Flags of the commands that build an engine (`kvobs serve`, `kvobs generate`), declared once."""

from __future__ import annotations

import argparse
import re

from kvobs.commands.common import add_session_end_flag
from kvobs.semconv.reasons import EvictionPolicyName, names

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "1073741824", "512MiB", "2GiB", "1.5G" (K/M/G/T: powers of 1024, as vLLM reads them)."""
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 512MiB, 1073741824)")
    value, unit = float(match.group(1)), match.group(2).upper()
    return int(value * 1024 ** "_KMGT".index(unit or "_"))


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), a .gguf file, or a Hugging Face folder")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    cache = parser.add_mutually_exclusive_group()
    cache.add_argument("--num-blocks", type=int, help="KV blocks to preallocate")
    cache.add_argument("--kv-cache-memory", type=parse_size, help="KV cache budget, e.g. 1GiB (default 1GiB)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.add_argument("--max-model-len", type=int, help="longest prompt + output (default: the model's context)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="sequences running at once")
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget per step")
    parser.add_argument("--eviction-policy", default=EvictionPolicyName.LRU.value, choices=names(EvictionPolicyName))
    parser.add_argument("--session-ttl", type=float, default=30.0, help="session_ttl: seconds a paused session is kept")
    add_session_end_flag(parser)
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable the prefix cache")
    parser.add_argument(
        "--num-threads", type=int, help="CPU threads the model computes on (default: torch's, one per physical core)"
    )


def engine_config(args: argparse.Namespace):
    from instrumented_engine.config import EngineConfig

    return EngineConfig(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        kv_cache_memory=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching,
        eviction_policy=args.eviction_policy,
        session_ttl_s=args.session_ttl,
        session_end_after_s=args.session_end_after_s,
        num_threads=args.num_threads,
    )
