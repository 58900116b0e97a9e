"""`kvobs report`: one page of a range to hand over, as HTML and Markdown: the hit-rate shortfall split, the
recompute tax and the sessions that cost the most, the what-if at other cache sizes with the time to first token
and GPU-hours they save, and the TTL curve with its knee; each figure with its sample.

kvobs report --store sqlite:///kvobs.db --out report/
kvobs report --store sqlite:///kvobs.db --since 1796336000 --until 1796339600 --num-blocks 64,128 --out report/
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kvobs.commands.common import add_store_flag, lacks_extra, start_or_report


def add_parser(sub) -> None:
    from instrumented_engine.commands.whatif import add_gpu_hour_cost_flag, block_counts

    p = sub.add_parser("report", help="write one HTML and Markdown page of a range: shortfall, tax, what-if, TTL")
    add_store_flag(p)
    p.add_argument("--out", required=True, metavar="DIR", help="the directory to write report.html, report.md into")
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="from this time (default: the store's first)")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="to this time (default: the store's last)")
    p.add_argument(
        "--num-blocks",
        type=block_counts,
        metavar="N[,N...]",
        help="cache sizes for the what-if (default: half, one, two and four times the observed size)",
    )
    add_gpu_hour_cost_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if lacks_extra("report", "report", "matplotlib", find_only=True):
        return 2
    from instrumented_engine.report.content import report_sections
    from instrumented_engine.report.render import write_report
    from kvobs.store import open_store
    from kvobs.times import local_time

    store = start_or_report("report", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    try:
        span = store.reads.time_range()
        if span is None:
            print("kvobs report: the store holds no rows yet", file=sys.stderr)
            return 2
        first, last = span
        since = first if args.since is None else args.since
        until = last if args.until is None else args.until
        sizes = tuple(args.num_blocks) if args.num_blocks else None
        sections = report_sections(store, since, until, sizes=sizes, gpu_hour_cost=args.gpu_hour_cost)
    except ValueError as exc:
        print(f"kvobs report: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    header = [f"Range: {local_time(since)} to {local_time(until)}", f"Written {local_time(time.time())}"]
    paths = write_report(sections, Path(args.out), title="kvobs report", header=header)
    print(f"wrote {paths[0]} and {paths[1]} ({len(paths) - 2} charts)")
    return 0
