"""`kvobs import`: a recorded capture replayed into the store through the collector's own parts, on its own clock.

    kvobs import ./capture --store sqlite:///kvobs.db                     # one replica's files at the top
    kvobs import ./fleet-capture --store postgresql://kvobs@db/kvobs      # a folder per replica, exports on top

The layout is `collectors.capture`'s (what the project's recorders write); then `kvobs whatif`, `kvobs doctor` and
the dashboard read the store as they read a live collector's. It prints what `kvobs doctor --collector` would have
said of the collector that took the capture (its wire shapes, lost batches, a shared prefix shorter than a block).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from kvobs.commands.common import add_store_flag, lacks_extra, start_or_report
from kvobs.semconv.endpoints import STORE_URL_ENV

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="replay a recorded capture (KV events, /metrics, OTLP traces) into the store")
    p.add_argument("capture", help="the capture's folder (kv_events.jsonl, metrics/, otlp_traces.jsonl)")
    p.add_argument(
        "--instance",
        help="the replica's name when its files sit at the folder's top (default: the folder's name); a folder per "
        "replica is named by its folder",
    )
    add_store_flag(p, what="the imported rows")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if lacks_extra("import", "collectors", "collectors.capture"):
        return 2
    from collectors.capture import CaptureError, import_capture
    from kvobs.store import open_store

    store = start_or_report("import", lambda: open_store(args.store or os.environ.get(STORE_URL_ENV)))
    if store is None:
        return 2
    try:
        summary = import_capture(store, Path(args.capture), instance=args.instance)
    except CaptureError as exc:
        print(f"kvobs import: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"imported {args.capture}: {summary.describe()}")
    for name, ok, words in summary.checks:  # what `kvobs doctor --collector` would have said of the collector
        print(f"  {'ok' if ok else 'PROBLEM'}  {name}: {words}")
    return 0
