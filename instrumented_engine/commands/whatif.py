"""`kvobs whatif`: replay the recorded requests through other cache sizes and policies.

kvobs whatif --store sqlite:///kvobs.db --num-blocks 32,64,128 --policy session_ttl --ttl 30
"""

from __future__ import annotations

import argparse
import sys

from kvobs.commands.common import add_store_flag, start_or_report
from kvobs.semconv.reasons import EvictionPolicyName, names


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of block counts: {text!r} (example: 32,64,128)") from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"block counts must be at least 2: {text!r}")
    return sizes


def add_parser(sub) -> None:
    p = sub.add_parser("whatif", help="replay recorded traffic through other KV cache sizes and eviction policies")
    add_store_flag(p)
    p.add_argument("--num-blocks", type=_sizes, required=True, metavar="N[,N...]", help="cache sizes in blocks")
    p.add_argument("--policy", default=EvictionPolicyName.LRU.value, choices=names(EvictionPolicyName),
                   help="eviction policy to replay")  # fmt: skip
    p.add_argument("--ttl", type=float, default=30.0, help="session_ttl: seconds a paused session is protected")
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="replay requests from this time")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="... up to this time")
    p.add_argument("--block-size", type=int, help="tokens per block (default: what the recorded events say)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from instrumented_engine.whatif import ReplayPlan, simulate
    except ImportError as exc:  # pragma: no cover - pandas and the block manager ship with the base install
        print(f"kvobs whatif cannot import the replay ({exc})", file=sys.stderr)
        return 2
    from kvobs.store import open_store

    store = start_or_report("whatif", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    try:
        plan = start_or_report("whatif", lambda: ReplayPlan.from_store(store, args.since, args.until,
                                                                       block_size=args.block_size))  # fmt: skip
        if plan is None:
            return 2
        if not plan.requests:
            print("kvobs whatif: no recorded request has a known block chain to replay", file=sys.stderr)
            return 2
        results = [simulate(plan, num_blocks=n, policy=args.policy, ttl_s=args.ttl) for n in args.num_blocks]
    finally:
        store.close()
    print(format_table(plan, results))
    return 0


LEGEND = (
    "blocks lost: each lost block once (evictions, invalidations, vLLM removals; resets not included). "
    "lost in tool pauses: blocks a session lost while it waited on a tool, counted once it came back "
    "(observed: {pending} more idle losses still pending; the replay knows each session's last request, so "
    "nothing is pending there). Our engine's data is replayed step for step: at the observed size and policy the "
    "replay is the run. vLLM's is replayed approximately (each request holds its length until it ends)."
)


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value) -> str:
    return "-" if value is None else f"{value:,}"


def format_table(plan, results) -> str:
    obs = plan.observed
    lines = [
        f"{len(plan.requests)} requests replayed ({plan.skipped} without a known chain skipped), "
        f"block size {plan.block_size}",
        "",
        "| configuration | blocks | hit rate | blocks lost | lost in tool pauses | recompute tokens | waited |",
        "|---|---|---|---|---|---|---|",
        f"| observed | {_num(obs.get('num_blocks'))} | {_pct(obs.get('hit_rate'))} | {_num(obs.get('evicted_blocks'))} "
        f"| {_num(obs.get('lost_in_pause_blocks'))} | {_num(obs.get('recompute_tokens'))} | - |",
    ]
    for r in results:
        lines.append(f"| {r.policy} | {r.num_blocks:,} | {_pct(r.hit_rate)} | {r.evicted_blocks:,} | "
                     f"{r.lost_in_pause_blocks:,} | {r.recompute_tokens:,} | {r.waited:,} |")  # fmt: skip
    lines += ["", LEGEND.format(pending=_num(obs.get("pending_idle_blocks")))]
    if any(r.too_large for r in results):
        lines.append("")
        lines.append("requests longer than the whole cache were not admitted: " +
                     ", ".join(f"{r.num_blocks} blocks: {r.too_large}" for r in results if r.too_large))  # fmt: skip
    return "\n".join(lines)
