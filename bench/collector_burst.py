"""A burst absorbed: a real `kvobs collect` on one KV-event stream while its publisher (a process of its own, as vLLM
is) sends `collector_ingest`'s synthetic vLLM batches at a sustained `--rate`, then `--burst-x` times that for
`--burst-s`, then the sustained rate again for `--calm-s`.

Counted as the indexers count, until every row is committed: the run ends when the collector has handled every batch
and its store writer has committed every row, and the store then holds every block row the batches make (else the
run fails: a rate with a loss is no rate). Offered against achieved: the publisher's window (first batch to last)
against the collector's (first batch sent to last row committed); it kept up when its window is within 1.1x the
publisher's. Sampled every 0.1 s meanwhile, as /metrics shows them: batches sent and not yet handled (the stream's
socket buffering), the store writer's rows held uncommitted and its oldest row's wait; after the burst, how long the
collector took to be back to the sustained rate's own (no batch behind by more than one sample, the oldest row under
a second). Units that found the store queue full, rows dropped and batches lost are counted; the pass wants none.

    python bench/collector_burst.py [--rate 8000] [--burst-x 10] [--burst-s 10] [--calm-s 15] [--store SQLite]
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from dataclasses import dataclass

from collector_ingest import STORES, _check_lossless, synthetic_payloads  # bench/ is on sys.path
from collector_workers import subscribed
from ports import free_port
from results import Result, detail, record

from collectors.collector import Collector, CollectorOptions
from kvobs.store import open_store
from kvobs.vllm import kv_events as wire

SAMPLE_S = 0.1
KEPT_UP = 1.1  # the collector's window at most this times the publisher's


def schedule(rate: float, events: int, burst_x: float, burst_s: float, calm_s: float) -> list[float]:
    """Each batch's send time (s from the first): calm, burst, calm; `events` events a batch."""
    times, t = [], 0.0
    for seconds, per_s in ((calm_s, rate), (burst_s, rate * burst_x), (calm_s, rate)):
        end, gap = t + seconds, events / per_s
        while t < end - 1e-9:
            times.append(t)
            t += gap
    return times


def publish(port: int, payloads: list[bytes], at: list[float], ready, go, sent) -> None:
    """A process of its own: each batch at its time (never early; late ones as fast as ZMQ takes them)."""
    pub = subscribed(port, len(payloads), linger_ms=60_000)
    if pub is None:
        return
    ready.set()
    go.wait()
    start = time.perf_counter()
    for seq, (payload, due) in enumerate(zip(payloads, at)):
        wait = start + due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        pub.send_multipart((b"", wire.seq_bytes(seq), payload))
        sent.value = seq + 1
    pub.close()


@dataclass
class Sample:
    t: float  # s since the first batch was due
    behind: int  # batches sent and not yet handled
    rows: int  # rows the store writer holds uncommitted
    lag_s: float  # its oldest row's wait


def run(url: str, payloads: list[bytes], at: list[float], burst_end: float) -> tuple[dict, list[Sample]]:
    store = open_store(url)
    port = free_port()
    options = CollectorOptions(kv_events=[f"burst=tcp://127.0.0.1:{port}"], kv_events_bind=True, interval_s=3600)
    collector = Collector(options, store=store)
    collector.start()
    spawn = multiprocessing.get_context("spawn")
    ready, go, sent = spawn.Event(), spawn.Event(), spawn.Value("q", 0)
    sender = spawn.Process(target=publish, args=(port, payloads, at, ready, go, sent))
    sender.start()
    if not ready.wait(60):
        raise TimeoutError("the publisher was not subscribed to in 60 s")
    subscriber, samples, stop = collector.streams[0].subscriber, [], threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            rows, lag_s, _, _ = collector.writer.depth_now()
            behind = sent.value - subscriber.num_batches
            samples.append(Sample(time.perf_counter() - start, behind, rows, lag_s))

    start = time.perf_counter()
    go.set()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    deadline = time.monotonic() + 600 + at[-1]
    while subscriber.num_batches < len(payloads):
        if time.monotonic() > deadline:
            raise TimeoutError("the collector did not take every batch in time")
        time.sleep(0.01)
    collector.writer.flush(600)  # every row committed
    window = time.perf_counter() - start
    stop.set()
    sampler.join()
    _, _, peak_rows, peak_lag_s = collector.writer.depth_now()
    found = {
        "window_s": window,
        "peak_rows": peak_rows,
        "capacity": collector.writer.max_queue,
        "peak_lag_s": peak_lag_s,
        "full": collector.writer.num_full,
        "dropped": collector.writer.num_dropped,
        "lost": subscriber.num_lost,
    }
    collector.stop()
    sender.join(30)
    _check_lossless("burst", store, payloads)  # (raises unless every block row is stored)
    store.close()
    after = [s for s in samples if s.t >= burst_end]
    calm_behind = max(1, round(SAMPLE_S / (at[1] - at[0]))) if len(at) > 1 else 1
    back = next((s.t for s in after if s.behind <= calm_behind and s.lag_s < 1.0), None)
    found["recovered_s"] = None if back is None else back - burst_end
    found["peak_behind"] = max((s.behind for s in samples), default=0)
    return found, samples


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=8000.0, help="sustained events/s")
    parser.add_argument("--burst-x", type=float, default=10.0, help="the burst's rate, times --rate")
    parser.add_argument("--burst-s", type=float, default=10.0)
    parser.add_argument("--calm-s", type=float, default=15.0, help="sustained seconds before the burst and after it")
    parser.add_argument("--events", type=int, default=50, help="events a batch")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--store", choices=sorted(STORES), default="SQLite")
    args = parser.parse_args(argv)
    at = schedule(args.rate, args.events, args.burst_x, args.burst_s, args.calm_s)
    payloads, total = synthetic_payloads(len(at), args.events, args.sessions)
    with tempfile.TemporaryDirectory() as tmp:
        found, _ = run(STORES[args.store].format(dir=tmp, run=0, n=1), payloads, at, args.calm_s + args.burst_s)
    offered = at[-1]
    kept_up = found["window_s"] <= KEPT_UP * offered
    burst_rate = args.rate * args.burst_x
    print(
        f"\n{total:,} events in {len(payloads):,} batches into {args.store}: {args.rate:,.0f} events/s, "
        f"{burst_rate:,.0f} for {args.burst_s:g} s, {args.rate:,.0f} again; every block row stored"
    )
    recovered = found["recovered_s"]
    said_recovered = "not within the run" if recovered is None else f"{recovered:.1f} s"
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| offered | {total:,} events over {offered:.1f} s ({args.rate:,.0f}/s, {burst_rate:,.0f}/s for "
        f"{args.burst_s:g} s) |",
        f"| achieved: first batch sent to last row committed | {found['window_s']:.1f} s "
        f"({found['window_s'] / offered:.2f}x the offered window: {'kept up' if kept_up else 'fell behind'}) |",
        f"| most batches sent and not yet handled | {found['peak_behind']:,} |",
        f"| most rows held by the store writer | {found['peak_rows']:,} (its queue takes {found['capacity']:,} "
        "besides the batch being written) |",
        f"| longest a row waited in the store writer | {found['peak_lag_s']:.2f} s |",
        f"| back to the sustained rate's own after the burst | {said_recovered} |",
        f"| units that found the store queue full / rows dropped / batches lost | {found['full']:,} / "
        f"{found['dropped']:,} / {found['lost']:,} |",
    ]
    print("\n".join(lines))
    detail("collector_burst", "\n".join(lines))
    ratio = offered / found["window_s"]
    case = f"{args.burst_x:g}x burst for {args.burst_s:g} s into {args.store}"
    return [
        Result("collector_burst", f"{case}: offered window over achieved", ratio, "", ratio, "offered window"),
        Result("collector_burst", f"{case}: longest wait in the store writer", found["peak_lag_s"], "s", 1.0, "itself"),
    ]


if __name__ == "__main__":
    record(main)
