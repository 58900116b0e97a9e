"""`kvobs generate`: run prompts through the engine and summarise the KV events they caused.

kvobs generate --chat "Plan a day in Rome." "Plan a day in Paris." --session trip-1
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from instrumented_engine.commands.engine_flags import add_engine_arguments, engine_config
from kvobs.commands.common import lacks_extra


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate with the instrumented engine and summarise its KV events")
    p.add_argument("prompt", nargs="+", help="one or more prompts (batched together)")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--session", help="session id attached to every request and KV event")
    add_engine_arguments(p)
    p.set_defaults(func=run, num_blocks=256, max_model_len=2048)


def run(args: argparse.Namespace) -> int:
    if lacks_extra("generate", "engine", "instrumented_engine.llm"):
        return 2
    from instrumented_engine import LLM, SamplingParams

    try:
        config = engine_config(args)
        llm = LLM(**vars(config))
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
