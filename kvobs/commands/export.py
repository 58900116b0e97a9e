"""`kvobs export mooncake`: the observed requests as Mooncake trace rows, for another tool's replay.

    kvobs export mooncake --store sqlite:///kvobs.db -o trace.jsonl              # agentic rows (Dynamo's replay)
    kvobs export mooncake --store sqlite:///kvobs.db --for aiperf -o trace.jsonl # AIPerf's multi-turn rows

The rows and what each field means: `kvobs.formats.mooncake`. It prints how many requests it wrote, how many it could
not (no known hash chain), and the block size each hash id stands for (a replay must be told it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvobs.commands.common import add_store_flag, start_or_report


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write the observed requests in a format another tool replays")
    p.add_argument("format", choices=["mooncake"], help="mooncake: Mooncake trace rows (JSONL)")
    p.add_argument(
        "--for",
        dest="flavor",
        choices=["agentic", "aiperf"],
        default="agentic",
        help="agentic: Dynamo's agentic rows (wait_for, tool_wait_ms); aiperf: AIPerf's multi-turn rows",
    )
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="from this time (default: the store's first)")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="to this time (default: the store's last)")
    p.add_argument("-o", "--output", help="the JSONL file to write (default: stdout)")
    add_store_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvobs.formats.mooncake import mooncake_rows
    from kvobs.store import open_store

    store = start_or_report("export", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    try:
        trace = mooncake_rows(store, args.since, args.until, flavor=args.flavor)
    except ValueError as exc:
        print(f"kvobs export: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    if args.output:
        Path(args.output).write_text(trace.jsonl())
    else:
        sys.stdout.write(trace.jsonl())
    print(
        f"kvobs export: {len(trace.rows):,} requests as {args.flavor} Mooncake rows, {len(trace.ids):,} distinct "
        f"blocks of {trace.block_size} tokens each (tell the replay its block size); {trace.skipped:,} requests "
        "left out (no known hash chain)",
        file=sys.stderr,
    )
    return 0
