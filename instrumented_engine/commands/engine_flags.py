"""Flags of the commands that build an engine (`kvobs serve`, `kvobs generate`), declared once."""

from __future__ import annotations

import argparse
import re

from instrumented_engine.config import OFFLOAD_EVENTS, OFFLOADING_BACKENDS, PLACEHOLDER
from kvobs.commands.common import add_session_end_flag, check_memory, number
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
    cache.add_argument("--num-blocks", type=number(int, at_least=2), help="KV blocks to preallocate")
    cache.add_argument("--kv-cache-memory", type=parse_size, help="KV cache budget, e.g. 1GiB (default 1GiB)")
    parser.add_argument("--block-size", type=number(int, at_least=1), default=16, help="tokens per KV block")
    parser.add_argument(
        "--max-model-len", type=number(int, at_least=1), help="longest prompt + output (default: the model's context)"
    )
    parser.add_argument("--max-num-seqs", type=number(int, at_least=1), default=64, help="sequences running at once")
    parser.add_argument(
        "--max-num-batched-tokens", type=number(int, at_least=1), default=2048, help="token budget per step"
    )
    parser.add_argument("--eviction-policy", default=EvictionPolicyName.LRU.value, choices=names(EvictionPolicyName))
    parser.add_argument(
        "--session-ttl",
        type=number(float, at_least=0),
        default=30.0,
        help="session_ttl: seconds a paused session is kept",
    )
    add_session_end_flag(parser)
    parser.add_argument("--no-prefix-caching", action="store_true", help="disable the prefix cache")
    tier = parser.add_argument_group("offload tier (vLLM's offloading connector: a CPU tier below the KV cache)")
    tier.add_argument(
        "--kv-offloading-size",
        type=number(float, above=0),
        metavar="GIB",
        help="GiB of host memory for a CPU tier below the KV cache, as vLLM's flag (default: no tier)",
    )
    tier.add_argument(
        "--kv-offloading-backend",
        default="native",
        choices=OFFLOADING_BACKENDS,
        help="the tier's implementation, as vLLM's flag: native (vLLM's own offloading connector, LRU)",
    )
    tier.add_argument(
        "--kv-offload-events",
        default=PLACEHOLDER,
        choices=OFFLOAD_EVENTS,
        help="the tier's KV events: placeholder (vLLM's default: a hash a block, no tokens) or self-describing "
        "(vLLM's self_describing_kv_events: tokens and chain)",
    )
    parser.add_argument(
        "--num-threads",
        type=number(int, at_least=1),
        help="CPU threads the model computes on (default: torch's, one per physical core)",
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
        kv_offloading_size=None if args.kv_offloading_size is None else int(args.kv_offloading_size * 2**30),
        kv_offloading_backend=args.kv_offloading_backend,
        kv_offload_events=args.kv_offload_events,
    )


def check_cache_fits(args: argparse.Namespace) -> None:
    """Before any weight is loaded or store opened: one sequence of `--max-model-len` fits the KV cache, and the
    cache fits this machine's memory, read from the model's header alone (`loader.model_shape`), said in flags.

    Raises:
        ValueError: the line to print.
    """
    from instrumented_engine.config import CacheLayout, CacheTooSmall
    from instrumented_engine.engine.llm_engine import resolve_device_dtype
    from instrumented_engine.models.loader import model_shape

    config = engine_config(args)
    shape = model_shape(args.model)
    if args.max_model_len and args.max_model_len > shape.context:
        raise ValueError(f"--max-model-len {args.max_model_len:,} exceeds this model's context of {shape.context:,}")
    device, dtype = resolve_device_dtype(config)
    try:
        layout = CacheLayout.derive(
            config, bytes_per_token=shape.kv_bytes_per_token(dtype.itemsize), model_context=shape.context
        )
    except CacheTooSmall as exc:
        cache = f"--num-blocks {exc.num_blocks:,}" if args.num_blocks else f"a KV cache of {exc.num_blocks:,} blocks"
        length = (
            f"--max-model-len {exc.max_model_len:,}"
            if args.max_model_len
            else f"the model's context, {exc.max_model_len:,} (no --max-model-len given)"
        )
        raise ValueError(
            f"{cache} of {exc.block_size} tokens cannot hold one sequence of {length}: it needs {exc.needed:,} blocks "
            f"(block 0 is reserved); pass --num-blocks {exc.needed:,} or more, or --max-model-len "
            f"{exc.longest_fitting:,} or less"
        ) from None
    if device.type == "cpu":  # (a GPU's cache is in its own memory, which the engine's allocation checks)
        element = str(dtype).removeprefix("torch.")
        what = f"the KV cache ({layout.bytes_per_block:,} bytes a block of {layout.block_size} tokens in {element})"
        check_memory("--num-blocks", layout.num_blocks, layout.num_blocks * layout.bytes_per_block, what)
    if layout.num_offload_blocks:
        what = f"the offload tier ({layout.num_offload_blocks:,} blocks of {layout.bytes_per_block:,} bytes)"
        tier_bytes = layout.num_offload_blocks * layout.bytes_per_block
        check_memory("--kv-offloading-size", args.kv_offloading_size, tier_bytes, what)
