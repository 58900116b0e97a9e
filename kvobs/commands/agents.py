"""`kvobs agents`: run the agent workload against an OpenAI-compatible server (our engine or a vLLM).

kvobs agents --base-url http://127.0.0.1:8000 --sessions 16 --concurrency 4 --steps 6 \\
             --tool-pause-ms exp:800 --step-deadline-s 20 --store sqlite:///kvobs.db --otlp-endpoint http://jaeger:4317

With `--no-store` the agents write nothing themselves: their spans, sent to a `kvobs collect` at `--otlp-endpoint`,
carry the sessions and steps, and the collector writes them (the agents hold no store credentials).

`--rounds 0` keeps running rounds (round r uses seed + r, so every round has new sessions) until SIGINT or
SIGTERM; then each session ends after its current step and the store and spans are flushed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from kvobs.agent.calibrate import DEFAULT_CONCURRENCY, LATER_STEPS_ROOM, SMALLEST_DEADLINE_S
from kvobs.commands.common import add_store_flag, start_or_report, workload_config
from kvobs.semconv.reasons import StepRouting, names
from kvobs.semconv.spans import StepErrorType

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser("agents", help="run ReAct-style agent sessions against a server, recording steps")
    p.add_argument(
        "--base-url",
        required=True,
        action="append",
        help="the server, e.g. http://127.0.0.1:8000 (or .../v1); repeat it for several replicas (see --routing)",
    )
    p.add_argument(
        "--routing",
        choices=names(StepRouting),
        default="round_robin",
        help="with several --base-url: which replica each step goes to (round_robin: the next one for every step; "
        "session: one per session; random). Client-side, for tests and demos: in production your router decides",
    )
    p.add_argument("--sessions", type=int, default=8, help="agent sessions in all")
    p.add_argument(
        "--concurrency",
        type=int,
        help=f"sessions running at once (default: {DEFAULT_CONCURRENCY}, fewer where the server is too slow for it)",
    )
    p.add_argument("--steps", type=int, default=4, help="steps per session")
    p.add_argument(
        "--tool-pause-ms",
        default="exp:500",
        metavar="DIST",
        help="tool pause in ms: 300, uniform:100-900, exp:500 (mean), lognormal:500,0.8",
    )
    p.add_argument(
        "--step-deadline-s",
        type=float,
        help="a step fails when it takes longer (default: fitted to the server, measured at start on the first "
        f"--base-url: {LATER_STEPS_ROOM:g} x its slowest first step, at least {SMALLEST_DEADLINE_S:g} s)",
    )
    p.add_argument("--max-tokens", type=int, default=48, help="reply tokens per step")
    p.add_argument("--model", help="model name (default: the first one the server lists)")
    p.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="session ids, kinds, tasks and pauses follow from it; 'clock': from the current time",
    )
    p.add_argument("--rounds", type=int, default=1, help="workload rounds (0: until SIGINT/SIGTERM)")
    p.add_argument("--round-pause-s", type=float, default=10.0, help="seconds between rounds")
    add_store_flag(p, what="sessions and steps")
    p.add_argument(
        "--no-store",
        action="store_true",
        help="write nothing to a store: the agents' spans carry their steps to `kvobs collect` at "
        "--otlp-endpoint, which writes them (the agents then need no store credentials)",
    )
    p.add_argument("--otlp-endpoint", help="send the agents' spans here (default: OTEL_EXPORTER_OTLP_* if set)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _seed(text: str) -> int:
    if text == "clock":
        return int(time.time())
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a seed: {text!r} (an integer, or 'clock')") from None


def run(args: argparse.Namespace) -> int:
    from kvobs.agent.workload import WorkloadConfig, check_rounds, round_configs

    def configured() -> WorkloadConfig:
        check_rounds(args.rounds, args.round_pause_s)
        return workload_config(
            args,
            base_url=args.base_url[0],
            replica_urls=tuple(args.base_url) if len(args.base_url) > 1 else (),
            routing=args.routing,
            seed=args.seed,
            model=args.model,
        )

    config = start_or_report("agents", configured)
    if config is None:
        return 2
    if args.no_store and not (
        args.otlp_endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        print(
            "kvobs agents: --no-store needs --otlp-endpoint (a kvobs collect): the steps would go nowhere",
            file=sys.stderr,
        )
        return 2
    if args.step_deadline_s is None:
        config = _fitted(args, config)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    for round_config in round_configs(config, args.rounds, args.round_pause_s, stop):
        result = run_workload(
            round_config,
            store_url=None if args.no_store else args.store,
            otlp_endpoint=args.otlp_endpoint,
            progress=not args.no_progress,
            stop=stop,
            record=not args.no_store,
        )
        if result is None:
            return 2
        print(
            f"seed {round_config.seed}: {result.sessions} sessions, {result.steps} steps in {result.wall_s:.1f} s; "
            f"failed steps: {result.failed_summary()}",
            flush=True,
        )
        hint = deadline_hint(result, round_config.step_deadline_s)
        if hint:
            print(f"kvobs agents: {hint}", file=sys.stderr, flush=True)
    return 0


def deadline_hint(result, deadline_s: float | None) -> str | None:
    """When most of a round's steps timed out, that the deadline is short for the server, with what to do."""
    timeouts = result.failed.get(StepErrorType.TIMEOUT.value, 0)
    if deadline_s is None or timeouts * 2 <= result.steps:
        return None
    return (
        f"{timeouts} of {result.steps} steps passed the step deadline of {deadline_s:g} s: that is the server's "
        "speed more than its cache. Leave out --step-deadline-s to fit it to the server, or pass a longer one."
    )


def _fitted(args: argparse.Namespace, config):
    """`config` with the step deadline (and, where needed, the concurrency) fitted to the first server, measured
    now; said on stderr with what the measurement sent."""
    from dataclasses import replace

    from kvobs.agent.calibrate import fit_workload
    from kvobs.agent.workload import measure_first_steps
    from kvobs.times import local_time

    started = time.time()
    try:
        fit = fit_workload(
            lambda n: measure_first_steps(config.base_url, n, config.max_tokens, model=config.model),
            concurrency=min(config.concurrency, config.sessions),  # no more at once than a round runs
            deadline_s=None,
            concurrency_given=args.concurrency is not None,
        )
    except Exception as exc:  # a measurement, never a reason not to run
        print(
            f"kvobs agents: could not measure {config.base_url} ({exc}); the step deadline is "
            f"{UNMEASURED_DEADLINE_S:g} s",
            file=sys.stderr,
        )
        return replace(config, step_deadline_s=UNMEASURED_DEADLINE_S)
    sent = sum(m.concurrency for m in fit.measurements)
    print(
        f"kvobs agents: {fit.said}. The measurement sent {sent} requests with no session to {config.base_url} "
        f"from {local_time(started)} to {local_time(time.time())}: that server counts them.",
        file=sys.stderr,
        flush=True,
    )
    return replace(config, step_deadline_s=fit.step_deadline_s, concurrency=fit.concurrency)


UNMEASURED_DEADLINE_S = 30.0  # where the server could not be measured: the agents' deadline before it was fitted


def run_workload(
    config,
    *,
    store_url: str | None,
    otlp_endpoint: str | None,
    otlp_protocol: str | None = None,
    progress: bool = True,
    stop=None,
    record: bool = True,
):
    """Run the workload with telemetry (`otlp_protocol`: None reads `OTEL_EXPORTER_OTLP_*`) and (`record`) a store
    recorder; None (after one line on stderr) when it cannot start."""
    import httpx
    from opentelemetry.sdk.trace import TracerProvider
    from tqdm import tqdm

    from kvobs.agent.routing import StepRouter
    from kvobs.agent.workload import Workload, api_root
    from kvobs.store import StoreWriter, open_store
    from kvobs.telemetry import TelemetryConfig, setup_telemetry

    store = start_or_report("agents", lambda: open_store(store_url)) if record else None
    if record and store is None:
        return None
    telemetry = setup_telemetry(
        TelemetryConfig(service_name="kvobs-agents", endpoint=otlp_endpoint, protocol=otlp_protocol, metrics=False)
    )
    tracer_provider = telemetry.tracer_provider or TracerProvider()  # real ids even unexported: steps join requests
    writer = StoreWriter(store) if store is not None else None
    client = StepRouter(
        [httpx.Client(base_url=api_root(url), timeout=config.timeout_s) for url in config.urls],
        config.routing,
        seed=config.seed,
    )
    bar = tqdm(
        total=config.sessions * config.steps, unit="step", desc="agent steps", disable=not progress, file=sys.stderr
    )
    try:
        workload = start_or_report(
            "agents", lambda: _workload(Workload, config, client, tracer_provider, writer, bar, stop)
        )
        if workload is None:
            return None
        return workload.run()
    finally:
        bar.close()
        client.close()
        telemetry.shutdown()
        if writer is not None:
            writer.close()
        if store is not None:
            store.close()


def _workload(cls, config, client, tracer_provider, writer, bar, stop):
    import httpx

    from kvobs.agent.recorder import StoreStepRecorder

    try:
        recorder = StoreStepRecorder(writer) if writer is not None else None
        return cls(
            config,
            client,
            tracer_provider=tracer_provider,
            recorder=recorder,
            on_step=lambda step: bar.update(1),
            stop=stop,
        )
    except httpx.HTTPError as exc:
        raise OSError(f"cannot reach {config.base_url}: {exc}") from exc
