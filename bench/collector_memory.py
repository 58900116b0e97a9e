"""Collector memory over many sessions: does RSS stay flat as new sessions keep coming through the KV-event path?

`--sessions` distinct agent sessions (default 1,000,000), one after another, each storing a two-block chain and
losing it a little later, encoded as vLLM batches, decoded and fed to the collector's `KVIngest` writing to a
SQLite store (the real writer, bounded queue); footprints are snapshotted and idle sessions forgotten every
`--snapshot-every` sessions, as the collector's ticker does. Stream time advances 0.01 s per session, so with
`--session-idle-s 600` a session is forgotten about 60,000 sessions after it was last seen.

The baseline, in the same run, is the same stream with forgetting off (`--session-idle-s` beyond the stream's
length): what memory did before this limit. RSS is printed every `--report-every` sessions.

    python bench/collector_memory.py [--sessions 1000000] [--session-idle-s 600]
"""

from __future__ import annotations

import argparse
import gc
import resource
import tempfile
from pathlib import Path

from results import Result, record  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

from collectors.kv.ingest import KVIngest
from kvobs.store import StoreWriter, open_store
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode


def rss_mb() -> float:
    """Resident set size now (Linux /proc), MB."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / 2**20


def batches(session: int) -> tuple[bytes, bytes]:
    ts, hashes = 1.8e9 + session * 0.01, [session * 2 + 1, session * 2 + 2]
    stored = wire.BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[],
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=f"agent-session-{session:08d}",
    )
    removed = wire.BlockRemoved(block_hashes=hashes, medium="GPU")
    return tuple(wire.encode_batch(wire.KVEventBatch(t, [event])) for t, event in ((ts, stored), (ts + 0.005, removed)))


def stream(
    sessions: int, idle_s: float, store_dir: Path, *, report_every: int, snapshot_every: int, label: str
) -> list[tuple[int, float]]:
    store = open_store(f"sqlite:///{store_dir / f'{label}.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="bench", session_idle_s=idle_s, settle_s=0.0)
    points, seq = [], 0
    for session in tqdm(range(sessions), desc=label, unit="session", mininterval=2):
        for payload in batches(session):
            batch = decode(payload).batch
            ingest.on_batch(seq, batch)
            seq += 1
        if (session + 1) % snapshot_every == 0:
            ingest.snapshot()
        if (session + 1) % report_every == 0:
            gc.collect()
            points.append((session + 1, rss_mb()))
    writer.close(timeout_s=600)
    store.close()
    return points


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--session-idle-s", type=float, default=600.0)
    parser.add_argument("--report-every", type=int, default=100_000)
    parser.add_argument("--snapshot-every", type=int, default=500)
    args = parser.parse_args(argv)
    report = min(args.report_every, args.sessions)
    with tempfile.TemporaryDirectory() as tmp:
        kept = stream(
            args.sessions,
            1e12,
            Path(tmp),
            report_every=report,
            snapshot_every=args.snapshot_every,
            label="forgetting off",
        )
        forgot = stream(
            args.sessions,
            args.session_idle_s,
            Path(tmp),
            report_every=report,
            snapshot_every=args.snapshot_every,
            label="forgetting on",
        )
    print(
        f"\nCollector RSS (MB) as distinct sessions stream through the KV-event path; --session-idle-s "
        f"{args.session_idle_s:g} (about {args.session_idle_s / 0.01:,.0f} sessions)"
    )
    print("| sessions | forgetting off (baseline) | --session-idle-s | growth since previous row |")
    print("|---|---|---|---|")
    previous = None
    for (n, off), (_, on) in zip(kept, forgot):
        growth = "-" if previous is None else f"{on - previous:+.1f}"
        print(f"| {n:,} | {off:.1f} | {on:.1f} | {growth} |")
        previous = on
    # Flat after warm-up: the end against the halfway point, with and without forgetting.
    half = len(forgot) // 2
    return [
        Result(
            "collector_memory",
            f"RSS at {args.sessions:,} sessions, --session-idle-s {args.session_idle_s:g}",
            forgot[-1][1],
            "MB",
            forgot[-1][1] / kept[-1][1],
            "forgetting off",
        ),
        Result(
            "collector_memory",
            "RSS at the end / at half the sessions, --session-idle-s",
            forgot[-1][1],
            "MB",
            forgot[-1][1] / forgot[half][1],
            "RSS at half",
        ),
        Result(
            "collector_memory",
            "RSS at the end / at half the sessions, forgetting off",
            kept[-1][1],
            "MB",
            kept[-1][1] / kept[half][1],
            "RSS at half",
        ),
    ]


if __name__ == "__main__":
    record(main)
