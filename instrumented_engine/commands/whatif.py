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
    p.add_argument(
        "--policy",
        default=EvictionPolicyName.LRU.value,
        choices=names(EvictionPolicyName),
        help="eviction policy to replay",
    )
    p.add_argument("--ttl", type=float, default=30.0, help="session_ttl: seconds a paused session is protected")
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="replay requests from this time")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="... up to this time")
    p.add_argument("--block-size", type=int, help="tokens per block (default: what the recorded events say)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from instrumented_engine.whatif_runs import observed_total, replay_plans, simulate_runs
    from kvobs.store import open_store

    store = start_or_report("whatif", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    try:
        plans = start_or_report(
            "whatif", lambda: replay_plans(store, args.since, args.until, block_size=args.block_size)
        )
        if plans is None:
            return 2
        if not any(plan.requests for plan in plans):
            print("kvobs whatif: no recorded request has a known block chain to replay", file=sys.stderr)
            return 2
        runs = [simulate_runs(plans, num_blocks=n, policy=args.policy, ttl_s=args.ttl) for n in args.num_blocks]
        observed = observed_total(plans, store, args.since, args.until)
    finally:
        store.close()
    print(format_table(plans, observed, runs))
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


def format_table(plans, observed: dict, runs: list) -> str:
    """The replay's table: observed, then each size (every run replayed through its own cache, added up); with
    several runs, each run's own rows after."""
    from kvobs.commands.common import local_time

    replayed, skipped = sum(len(p.requests) for p in plans), sum(p.skipped for p in plans)
    lines = [
        f"{replayed} requests replayed ({skipped} without a known chain skipped), block size "
        f"{', '.join(sorted({str(p.block_size) for p in plans}))}"
    ]
    if len(plans) > 1:
        lines.append(
            f"{len(plans)} runs, replayed one by one (each began with an empty cache): "
            + "; ".join(p.span.label(local_time) for p in plans)
        )
    elif plans[0].span is not None and plans[0].span.run_id is None:
        lines.append("no engine runs are recorded in this store: the range is replayed as one run")
    lines += ["", *_rows(observed, [total for total, _ in runs])]
    if len(plans) > 1:
        for i, plan in enumerate(plans):
            lines += ["", f"{plan.span.label(local_time)}:", *_rows(plan.observed, [per[i] for _, per in runs])]
    lines += ["", LEGEND.format(pending=_num(observed.get("pending_idle_blocks")))]
    too_large = [(total.num_blocks, total.too_large) for total, _ in runs if total.too_large]
    if too_large:
        lines.append("")
        lines.append(
            "requests longer than the whole cache were not admitted: "
            + ", ".join(f"{n} blocks: {count}" for n, count in too_large)
        )
    return "\n".join(lines)


def _rows(obs: dict, results) -> list[str]:
    from instrumented_engine.whatif_runs import COMPARISON, comparison

    lines = ["| " + " | ".join(COMPARISON) + " |", "|" + "---|" * len(COMPARISON)]
    for row in comparison(obs, results):
        cells = [row["configuration"], _num(row["blocks"]), _pct(row["hit rate"]), *map(_num, list(row.values())[3:])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
