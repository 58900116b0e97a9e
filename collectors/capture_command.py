"""`kvobs import`: a recorded capture replayed into the store through the collector's own parts, on its own clock.

    kvobs import ./capture --store sqlite:///kvobs.db                     # one replica's files at the top
    kvobs import ./fleet-capture --store postgresql://kvobs@db/kvobs      # a folder per replica, exports on top
    kvobs import dynamo-trace /tmp/dynamo-request-trace.*.jsonl.gz         # NVIDIA Dynamo's request trace shards

The layout is `collectors.capture`'s (what the project's recorders write); then `kvobs whatif`, `kvobs doctor` and
the dashboard read the store as they read a live collector's. It prints what `kvobs doctor --collector` would have
said of the collector that took the capture (its wire shapes, lost batches, a shared prefix shorter than a block).
`dynamo-trace` takes Dynamo's `dynamo.request.trace.v1` shards instead (`collectors.dynamo_trace`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kvobs.commands.common import add_store_flag, lacks_extra, start_or_report
from kvobs.semconv.endpoints import STORE_URL_ENV

log = logging.getLogger(__name__)

DYNAMO = "dynamo-trace"
T = TypeVar("T")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import",
        help="replay a recorded capture (KV events, /metrics, OTLP traces), or NVIDIA Dynamo's request trace "
        "(dynamo-trace FILE...), into the store",
    )
    p.add_argument("capture", help=f"the capture's folder (kv_events.jsonl, metrics/, otlp_traces.jsonl), or {DYNAMO}")
    p.add_argument("files", nargs="*", help=f"after {DYNAMO}: its JSONL or JSONL.GZ shards")
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
    from kvobs.store import open_store

    if (args.capture == DYNAMO) != bool(args.files):
        print(f"kvobs import: the files follow {DYNAMO}; a capture folder takes none", file=sys.stderr)
        return 2
    store = start_or_report("import", lambda: open_store(args.store or os.environ.get(STORE_URL_ENV)))
    if store is None:
        return 2
    if args.capture == DYNAMO:
        from collectors.dynamo_trace import DEFAULT_INSTANCE, DynamoTraceError, import_dynamo_trace

        files = [Path(f) for f in args.files]
        read = _imported(
            store,
            lambda: import_dynamo_trace(store, files, instance=args.instance or DEFAULT_INSTANCE),
            DynamoTraceError,
        )
        if read is None:
            return 2
        print(f"imported the Dynamo request trace ({len(files)} files): {read.describe()}")
        return 0
    from collectors.capture import CaptureError, import_capture

    summary = _imported(store, lambda: import_capture(store, Path(args.capture), instance=args.instance), CaptureError)
    if summary is None:
        return 2
    print(f"imported {args.capture}: {summary.describe()}")
    for name, ok, words in summary.checks:  # what `kvobs doctor --collector` would have said of the collector
        print(f"  {'ok' if ok else 'PROBLEM'}  {name}: {words}")
    return 0


def _imported(store, take: Callable[[], T], error: type[Exception]) -> T | None:
    """What `take` read into the store (closed after); None, said on stderr, where it raised `error`."""
    try:
        return take()
    except error as exc:
        print(f"kvobs import: {exc}", file=sys.stderr)
        return None
    finally:
        store.close()
