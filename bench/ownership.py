"""What ownership by inference costs: tying each request's stored blocks to it where the blocks name no session
(`kvobs.analytics.cache.ownership.block_ties`), on the real vLLM 0.32 run (tests/fixtures/vllm-0.32-cpu: the
requests of 12 agents at once and their stored blocks) laid end to end `--copies` times (each copy later by the run's
length, its hashes its own), against reading the same requests' chains by their sessions' named blocks
(`chains.request_chains`, what the header allows: the baseline), with the same tie's truth check: every block
given to a session is the one its header named.

    .venv/bin/python bench/ownership.py                   # 200 copies: 10,800 requests, 62,600 blocks
    .venv/bin/python bench/ownership.py --copies 20

CPU time, one thread.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from pathlib import Path

import pandas as pd
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from results import Result, record  # bench/ is on sys.path when a script in it runs

from collectors.traces.span_ingest import SpanIngest
from kvobs.analytics.cache import BlockGraph, block_ties, owned_stored, request_chains
from kvobs.vllm import kv_events as wire

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32-cpu"
HASH_SPACE = 1 << 64


class _Records:
    """The request records the collector's span ingest makes of the recording (its store writer's place)."""

    def __init__(self) -> None:
        self.records: list = []

    def offer(self, records) -> bool:
        self.records += records
        return True


def recorded() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, stored blocks) of the recorded run; each request with the session its trace's agent step had."""
    rows = []
    for line in (RECORDED / "kv_events.jsonl").read_text().splitlines():
        frames = [base64.b64decode(f) for f in json.loads(line)["frames_b64"]]
        batch = wire.decode_batch(frames[-1]).batch
        for event in batch.events:
            if type(event) is wire.BlockStored and event.block_hashes:
                hashes = wire.as_uint64_list(event.block_hashes)
                parents = [None if event.parent_block_hash is None else wire.as_uint64(event.parent_block_hash)]
                rows += zip([batch.ts] * len(hashes), hashes, parents + hashes[:-1], [event.session_id] * len(hashes))
    stored = pd.DataFrame(rows, columns=["ts", "block_hash", "parent_hash", "session_id"], dtype=object).assign(
        ts=lambda f: f["ts"].astype(float), instance="vllm", num_tokens=128
    )  # (hashes as Python ints: a uint64 does not fit a float)
    sink = _Records()
    ingest = SpanIngest(sink, instance="vllm")
    for line in (RECORDED / "otlp_traces.jsonl").read_text().splitlines():
        ingest.handle(ExportTraceServiceRequest.FromString(base64.b64decode(json.loads(line)["body_b64"])))
    requests = pd.DataFrame([r.to_row() for r in sink.records])
    sessions = {s["trace_id"]: s["session"] for s in json.loads((RECORDED / "agent_steps.json").read_text())}
    return requests.assign(session_id=requests["trace_id"].map(sessions)), stored


def tiled(requests: pd.DataFrame, stored: pd.DataFrame, copies: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The run `copies` times end to end: each copy shifted by the run's length, its hashes and ids its own."""
    first = min(stored["ts"].min(), requests["arrival_ts"].min())
    span = max(stored["ts"].max(), requests["finished_ts"].max()) - first
    reqs, blocks = [], []
    for i in range(copies):
        shift = i * (span + 1.0)
        reqs.append(
            requests.assign(
                request_id=requests["request_id"] + f"-{i}",
                session_id=requests["session_id"] + f"-{i}",
                **{c: requests[c] + shift for c in ("arrival_ts", "first_token_ts", "finished_ts")},
            )
        )

        def moved(column: pd.Series, offset: int = i * 7919) -> pd.Series:  # (a list: .map would make floats)
            return pd.Series([None if h is None else (h + offset) % HASH_SPACE for h in column], dtype=object)

        blocks.append(
            stored.assign(
                ts=stored["ts"] + shift,
                block_hash=moved(stored["block_hash"]),
                parent_hash=moved(stored["parent_hash"]),
                session_id=stored["session_id"] + f"-{i}",
            )
        )
    return pd.concat(reqs, ignore_index=True), pd.concat(blocks, ignore_index=True)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=200)
    args = parser.parse_args(argv)
    requests, stored = tiled(*recorded(), args.copies)
    unnamed = stored.assign(session_id=None)

    start = time.process_time()
    request_chains(requests, stored, BlockGraph.from_stored(stored))
    base = time.process_time() - start
    start = time.process_time()
    ties = block_ties(requests, unnamed)
    owned = owned_stored(unnamed, ties)
    tied = time.process_time() - start

    inferred = owned["tie"] == "inference"
    wrong = int((owned.loc[inferred, "session_id"] != stored.loc[inferred, "session_id"]).sum())
    n = len(requests)
    print(
        f"\n{n:,} requests ({args.copies} copies of the recorded vLLM 0.32 run), {len(stored):,} stored blocks; "
        f"{int(inferred.sum()):,} blocks tied by inference, {wrong} to another session than the header's; CPU time"
    )
    print("| stage | CPU seconds | requests/s | time vs baseline |")
    print("|---|---|---|---|")
    for name, seconds in (("chains by the header's names (baseline)", base), ("ownership by inference", tied)):
        print(f"| {name} | {seconds:.2f} | {n / seconds:,.0f} | {seconds / base:.2f}x |")
    return [Result("ownership", "ownership by inference", n / tied, "requests/s", tied / base, "chains by header")]


if __name__ == "__main__":
    record(main)
