"""What telemetry costs the engine: output tokens/s with it off, metrics only, and full tracing, in one run.

Workload: `--sessions` agent-like requests sharing a long system prompt, each with its own question, through a
cache small enough to evict (so eviction events and span links are produced too), `--new-tokens` greedy tokens
each. Every configuration runs on a fresh engine over the same weights; configurations are interleaved
`--repeats` times (in a rotating order) and the median is reported, with the ratio to "off" measured in the same run.
"time in telemetry" is the share of the engine loop's wall time spent inside the observers (span building, metric
updates), plus the CPU time of the span export thread (batching, serializing, sending: `OtelBatchSpanRecordProcessor`,
read from /proc; the in-process OTLP receiver, the far end, is not counted): the overhead itself, free of the
run-to-run noise that tokens/s carries on a busy 2-core machine.

- off: no observer at all (what `kvobs serve` does without an OTLP endpoint, minus /metrics)
- metrics: /metrics (Prometheus) plus the same values through an OTel MeterProvider
- tracing, ratio 0.0: /metrics plus the tracer with a sampler that keeps nothing (requests arrive without a
  `traceparent`, so the ratio sampler decides): what an unsampled request costs
- tracing (in-process): /metrics plus `llm_request` spans with KV span events, batch processor, in-memory exporter
  (sampling ratio 1.0: every request's `traceparent` says sampled)
- tracing (OTLP gRPC): the same, exported over gRPC to an OTLP receiver in this process
- tracing + step spans: in-process, with a `kvcache.step` span every step (opt-in: `step_sample_every`, off by
  default), the engine's finest-grained spans

Per block: the same time in telemetry over the block events the run made (blocks stored in the prefix cache and
blocks evicted, what its KV-event stream publishes one row each), in CPU µs a block event. The engine makes no span a
block: a request's blocks are counted on its `llm_request` span's events and a batch of losses is one span, so this
is the price of that story per block, with tracing on and off.

    python bench/telemetry_overhead.py [--sessions 24] [--new-tokens 32] [--repeats 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from results import Result, record  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

from collectors.traces.otlp_receiver import OTLPReceiver
from instrumented_engine.config import EngineConfig
from instrumented_engine.engine import events as ev
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.models.loader import open_model
from instrumented_engine.observers.metrics import EngineMetrics
from instrumented_engine.observers.otel_metrics import OTelMetricSink
from instrumented_engine.observers.spans import EngineTracer
from instrumented_engine.sampling_params import SamplingParams
from kvobs.telemetry import TelemetryConfig, setup_telemetry

UNSAMPLED = "tracing, ratio 0.0"
STEP_SPANS = "tracing + step spans"
SYSTEM = "You are a support agent for a parcel carrier. Track parcels, explain customs rules and fees. " * 6


def observers_for(config: str, engine: LLMEngine, otlp_port: int) -> tuple[list, list]:
    """The observers a configuration installs, and what to shut down after the run."""
    if config == "off":
        return [], []
    if config == "metrics":
        reader = InMemoryMetricReader()
        from opentelemetry.sdk.metrics import MeterProvider

        provider = MeterProvider(metric_readers=[reader])
        metrics = EngineMetrics(
            "smollm2",
            cache_config={},
            max_model_len=engine.layout.max_model_len,
            extra_sinks=[OTelMetricSink(provider.get_meter("bench"))],
        )
        return [metrics], [provider]
    if config == UNSAMPLED:
        telemetry = setup_telemetry(
            TelemetryConfig(span_exporters=[InMemorySpanExporter()], metrics=False, sample_ratio=0.0)
        )
    elif config in ("tracing (in-process)", STEP_SPANS):
        telemetry = setup_telemetry(TelemetryConfig(span_exporters=[InMemorySpanExporter()], metrics=False))
    else:
        telemetry = setup_telemetry(
            TelemetryConfig(endpoint=f"http://127.0.0.1:{otlp_port}", protocol="grpc", metrics=False)
        )
    metrics = EngineMetrics("smollm2", cache_config={}, max_model_len=engine.layout.max_model_len)
    tracer = EngineTracer(
        telemetry.tracer_provider,
        model_name="smollm2",
        block_size=engine.layout.block_size,
        medium="CPU",
        step_sample_every=1 if config == STEP_SPANS else 0,
    )
    return [metrics, tracer], [telemetry]


EXPORT_THREAD = "OtelBatch"  # the SDK's batch span processor thread: its name starts so
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def export_cpu_s() -> float:
    """CPU seconds used so far by the live span export threads (utime + stime in /proc/self/task/TID/stat)."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith(EXPORT_THREAD) and thread.native_id is not None:
            try:
                stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime: fields 14 and 15 of stat
    return total


def block_events(result) -> int:
    """The step's block events: blocks stored in the prefix cache and blocks evicted (a KV-event row each)."""
    return sum(
        len(e.block_hashes) if isinstance(e, ev.BlocksStored) else 1
        for e in result.events
        if isinstance(e, (ev.BlocksStored, ev.BlockEvicted))
    )


def run_once(
    source, config: str, prompts: list[list[int]], new_tokens: int, num_blocks: int, otlp_port: int
) -> tuple[float, float, float]:
    """Output tokens/s, the share of the loop's time spent in telemetry (inside the observers, and the export
    thread's CPU, its spans flushed before it is read), and that time in µs a block event."""
    config_ = EngineConfig(num_blocks=num_blocks, max_model_len=1024, max_num_seqs=len(prompts))
    engine = LLMEngine(config_, source=source, progress=False)
    observers, closers = observers_for(config, engine, otlp_port)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        headers = None if config == UNSAMPLED else {"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"}
        engine.add_request(prompt, params, session_id=f"s{i}", trace_headers=headers)
    generated = blocks = 0
    in_observers = 0.0
    exported_before = export_cpu_s()
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        result = engine.step()
        before = time.perf_counter()
        for observer in observers:
            observer.on_step(result)
        in_observers += time.perf_counter() - before
        generated += sum(len(o.new_token_ids) for o in result.outputs)
        blocks += block_events(result)
    elapsed = time.perf_counter() - start
    for closer in closers:
        if hasattr(closer, "force_flush"):
            closer.force_flush()
    exporting = export_cpu_s() - exported_before
    for closer in closers:
        closer.shutdown()
    spent = in_observers + exporting
    if not blocks:
        raise RuntimeError("the workload stored and evicted no block: no cost a block event to give")
    return generated / elapsed, spent / elapsed, spent / blocks * 1e6


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--num-blocks", type=int, default=96, help="small enough to evict under this workload")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--budget", type=float, default=0.03, help="the overhead goal, as a share of the engine loop")
    args = ap.parse_args(argv)

    source = open_model("smollm2").materialize()
    prompts = [
        source.tokenizer.encode(f"{SYSTEM}\nCustomer {i}: where is parcel P{i:05d}? It left {i} days ago.")
        for i in range(args.sessions)
    ]
    spans: list = []
    receiver = OTLPReceiver(
        lambda request: spans.append(len(request.resource_spans)), grpc_address="127.0.0.1:0", http_address=None
    )
    receiver.start()
    configs = ["off", "metrics", UNSAMPLED, "tracing (in-process)", "tracing (OTLP gRPC)", STEP_SPANS]
    results: dict[str, list[tuple[float, float, float]]] = {c: [] for c in configs}
    run_once(source, "off", prompts[:2], 4, args.num_blocks, receiver.grpc_port)  # warm-up
    with tqdm(total=len(configs) * args.repeats, desc="telemetry overhead", unit="run") as bar:
        for r in range(args.repeats):
            for config in configs[r % len(configs) :] + configs[: r % len(configs)]:  # rotated: no position bias
                results[config].append(
                    run_once(source, config, prompts, args.new_tokens, args.num_blocks, receiver.grpc_port)
                )
                bar.update()
    receiver.stop()
    baseline = statistics.median(r[0] for r in results["off"])
    print(
        f"\nworkload: {args.sessions} requests sharing a {len(prompts[0])}-token prompt, {args.new_tokens} new tokens"
        f" each, {args.num_blocks} KV blocks; median of {args.repeats} interleaved runs"
    )
    head = f"{'telemetry':26} {'output tok/s':>13} {'vs off':>8} {'time in telemetry':>18} {'us/block event':>15}"
    print(f"{head}   runs (tok/s)")
    rows = []
    metrics_us = statistics.median(r[2] for r in results["metrics"])
    for config in configs:
        tps = statistics.median(r[0] for r in results[config])
        share = statistics.median(r[1] for r in results[config])
        per_block = statistics.median(r[2] for r in results[config])
        runs = ", ".join(f"{r[0]:.0f}" for r in results[config])
        print(f"{config:26} {tps:13.1f} {tps / baseline:7.3f}x {share:17.2%} {per_block:15.2f}   {runs}")
        rows.append(Result("telemetry_overhead", f"telemetry {config}", tps, "tok/s", tps / baseline, "off"))
        if config != "off":
            rows.append(
                Result(
                    "telemetry_overhead",
                    f"share of the loop in telemetry, {config}",
                    share * 100,
                    "%",
                    share / max(args.budget, 1e-9),
                    "of the 3% budget",
                )
            )
            rows.append(
                Result(
                    "telemetry_overhead",
                    f"telemetry a block event, {config}",
                    per_block,
                    "µs",
                    per_block / max(metrics_us, 1e-9),
                    "metrics",
                )
            )
    print(f"OTLP receiver got {receiver.num_received} export requests")
    return rows


if __name__ == "__main__":
    record(main)
