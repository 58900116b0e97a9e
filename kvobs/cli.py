"""The `kvobs` command line. Each command imports its module lazily, so a collector-only install
(no torch) can run the commands it has.

    kvobs generate "The capital of France is" --max-tokens 32 --num-blocks 64
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter


def _generate(args: argparse.Namespace) -> int:
    try:
        from instrumented_engine import LLM, SamplingParams
    except ImportError as exc:
        print(f"kvobs generate needs the engine extra: pip install 'kvobs[engine]' ({exc})", file=sys.stderr)
        return 2
    try:
        llm = LLM(
            args.model,
            num_blocks=args.num_blocks,
            block_size=args.block_size,
            max_model_len=args.max_model_len,
            eviction_policy=args.eviction_policy,
            dtype=args.dtype,
        )
        sp = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
        sessions = [args.session] * len(args.prompt)
        if args.chat:
            outputs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], sp, session_ids=sessions)
        else:
            outputs = llm.generate(args.prompt, sp, session_ids=sessions)
    except ValueError as exc:
        print(f"kvobs generate: {exc}", file=sys.stderr)
        return 2
    for prompt, out in zip(args.prompt, outputs):
        print(
            f"--- {prompt!r}\n{out.text}\n[{len(out.output_token_ids)} tokens, {out.num_cached_tokens} prompt "
            f"tokens from the prefix cache, finish={out.finish_reason}]"
        )
    counts = Counter(e.kind for e in llm.events)
    print("KV events: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvobs", description="KV-cache observability for LLM agents")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate with the instrumented engine and summarise its KV events")
    gen.add_argument("prompt", nargs="+", help="one or more prompts (batched together)")
    gen.add_argument("--model", default="smollm2", help="smollm2, a .gguf file, or a Hugging Face folder")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--num-blocks", type=int, default=256)
    gen.add_argument("--block-size", type=int, default=16)
    gen.add_argument("--max-model-len", type=int, default=2048)
    gen.add_argument("--eviction-policy", default="lru", choices=["lru", "session_ttl"])
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gen.add_argument("--session", help="session id attached to every request and KV event")
    gen.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
