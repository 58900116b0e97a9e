"""Durability of the collector's OTLP path: is every span the collector acknowledged stored?

A real `kvobs collect --otlp-http` (a subprocess, SQLite store) receives `llm_request` spans from OpenTelemetry's own
OTLP/HTTP exporter (its retries on: a 429 is retried after `Retry-After`) in a burst larger than the writer's queue
can hold while the store is slow (another connection holds SQLite's write lock for `--stall-s` seconds, so the queue
fills). Printed per case: spans sent, acknowledged (the exporter reported success), stored, and acknowledged minus
stored, which must be 0.

- burst: the collector as it runs by default; the queue fills, the receiver answers 429, the exporter retries.
- SIGKILL: the same with `--spool-dir`, and the collector is killed (SIGKILL) in the middle of the burst; a new one
  started on the same spool writes what the dead one had acknowledged.
- baseline (same run): SIGKILL without a spool: what a kill loses when the queue lives in memory only.

    python bench/durability.py [--spans 200000] [--batch 2000] [--stall-s 12]
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ports import free_port  # bench/ is on sys.path when a script in it runs
from results import Result, record

from kvobs.store import open_store

SENDERS = 4


def make_spans(n: int) -> list:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    for i in range(n):
        with tracer.start_as_current_span("llm_request") as span:
            span.set_attributes(
                {
                    "gen_ai.request.id": f"r{i}",
                    "gen_ai.usage.prompt_tokens": 100,
                    "gen_ai.latency.time_to_first_token": 0.05,
                    "session.id": f"s{i % 500}",
                }
            )
    return exporter.get_finished_spans()


class Collector:
    def __init__(self, db: Path, port: int, spool: Path | None, log: Path) -> None:
        self.metrics_port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "kvobs.cli",
            "collect",
            "--otlp-http",
            f"127.0.0.1:{port}",
            "--store",
            f"sqlite:///{db}",
            "--interval",
            "3600",
            "--metrics-address",
            f"127.0.0.1:{self.metrics_port}",
        ]
        if spool is not None:
            cmd += ["--spool-dir", str(spool)]
        self.log = log
        with log.open("a") as err:  # a file, not a pipe nobody reads: a chatty collector must never block on it
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=b"", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the collector did not start: {log.read_text()[-2000:]}")

    def busy(self) -> int:
        """Exports this collector answered 429 (its /metrics)."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        return int(
            next(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("kvobs_collector_otlp_exports_busy_total")
            )
        )

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(30)


def send(spans: list, port: int, batch: int, *, kill_after: int | None = None, on_kill=None) -> tuple[int, int]:
    """Export `spans` in batches from SENDERS threads; (acknowledged, batches answered). With `kill_after`, `on_kill`
    runs once that many spans were acknowledged, and later exports simply fail."""
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=10)
    acknowledged, lock, killed = [0], threading.Lock(), threading.Event()

    def export(chunk: list) -> None:
        if killed.is_set():
            return  # the collector is gone: what is not yet sent is not part of the count
        ok = exporter.export(chunk) == SpanExportResult.SUCCESS
        with lock:
            if ok and not killed.is_set():
                acknowledged[0] += len(chunk)
            if kill_after is not None and acknowledged[0] >= kill_after and not killed.is_set():
                killed.set()
                on_kill()

    chunks = [spans[i : i + batch] for i in range(0, len(spans), batch)]
    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(export, chunks))
    return acknowledged[0], len(chunks)


def stored(db: Path) -> int:
    store = open_store(f"sqlite:///{db}")
    with store.engine.connect() as conn:
        n = conn.exec_driver_sql("SELECT count(DISTINCT span_id) FROM requests").scalar_one()
    store.close()
    return n


def stall(db: Path, seconds: float) -> None:
    """Hold SQLite's write lock for `seconds` from another connection: the store is as slow as a stalled server."""
    holder = sqlite3.connect(db, timeout=30, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")

    def release() -> None:
        time.sleep(seconds)
        holder.rollback()
        holder.close()

    threading.Thread(target=release, daemon=True).start()


def case(spans: list, work: Path, name: str, *, batch: int, stall_s: float, spool: bool, kill: bool) -> dict:
    db, port = work / f"{name}.db", free_port()
    spool_dir = work / f"{name}-spool" if spool else None
    open_store(f"sqlite:///{db}").close()  # migrated before the lock is taken
    log = work / f"{name}.log"
    collector = Collector(db, port, spool_dir, log)
    stall(db, stall_s)
    t0 = time.perf_counter()
    acked, _ = send(spans, port, batch, kill_after=len(spans) // 2 if kill else None, on_kill=collector.kill)
    elapsed = time.perf_counter() - t0
    busy = 0 if kill else collector.busy()
    if kill:
        time.sleep(stall_s)  # the lock is gone; a new collector writes the spool's backlog
        collector = Collector(db, port, spool_dir, log)
    collector.stop()
    return {"case": name, "sent": len(spans), "acknowledged": acked, "stored": stored(db), "s": elapsed, "busy": busy}


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2_000, help="spans per OTLP export")
    parser.add_argument("--stall-s", type=float, default=12.0, help="seconds the store is held at the burst's start")
    args = parser.parse_args(argv)
    spans = make_spans(args.spans)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        common = {"batch": args.batch, "stall_s": args.stall_s}
        rows.append(case(spans, work, "SIGKILL, no spool (baseline)", spool=False, kill=True, **common))
        rows.append(case(spans, work, "burst beyond the queue", spool=False, kill=False, **common))
        rows.append(case(spans, work, "SIGKILL mid-burst, --spool-dir", spool=True, kill=True, **common))
    print(
        f"\nOTLP durability: {args.spans:,} llm_request spans in exports of {args.batch:,} from {SENDERS} OTel "
        f"exporters; the store held for {args.stall_s:g} s at the start (SQLite, {os.cpu_count()} cores)"
    )
    print("| case | sent | acknowledged | stored | acknowledged - stored | exports answered 429 | time |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        busy = "n/a (killed)" if "SIGKILL" in r["case"] else f"{r['busy']:,}"
        print(
            f"| {r['case']} | {r['sent']:,} | {r['acknowledged']:,} | {r['stored']:,} | "
            f"{r['acknowledged'] - r['stored']:,} | {busy} | {r['s']:.1f} s |"
        )
    base = rows[0]
    lost_base = max(base["acknowledged"] - base["stored"], 0)
    return [
        Result(
            "durability",
            r["case"] + ": acknowledged, not stored",
            max(r["acknowledged"] - r["stored"], 0),
            "spans",
            (max(r["acknowledged"] - r["stored"], 0) / lost_base) if lost_base else 1.0,
            "of SIGKILL without a spool",
        )
        for r in rows
    ]


if __name__ == "__main__":
    record(main)
