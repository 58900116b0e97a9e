"""`kvobs demo`: the main job on one machine, no Docker.

    kvobs demo                         # engine + agent workload + dashboard on sqlite:///kvobs.db, Ctrl-C stops

Starts `kvobs serve` on SmolLM2 with a KV cache small enough that sessions evict each other, `kvobs collect`
taking OTLP/HTTP on `--collector-port`, and `kvobs dashboard`, prints the URLs, and runs the `kvobs agents`
workload against the engine the way a user's agents run: with no store, only an OTLP endpoint. The agents'
spans go to the collector, which makes them the sessions and steps in the store (and passes them on to
`--otlp-endpoint`, if given); the engine writes its requests, KV events and snapshots itself, as in
docker-compose.yml. After each round the demo waits (bounded) until the collector has stored the round's steps,
then prints its hit rate, failures and the built-in alert rules' verdicts. Everything stays up until Ctrl-C (or
exits with `--exit-when-done`). Children get SIGTERM on the way out, so the engine and the collector flush their
store rows and spans. Their logs go to files in `--log-dir` (named when the demo starts; a child that fails
shows the end of its log), so the terminal holds only the demo's lines.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from kvobs.addresses import port
from kvobs.agent.calibrate import DEFAULT_CONCURRENCY, LATER_STEPS_ROOM, SMALLEST_DEADLINE_S
from kvobs.commands.children import Child, Watch, start, stop_all, wait_ready
from kvobs.commands.common import add_store_flag, ports_in_use, refuse_ports_in_use, start_or_report, workload_config
from kvobs.semconv.endpoints import DASHBOARD_PORT, DEMO_COLLECTOR_PORT, ENGINE_PORT

log = logging.getLogger(__name__)

ENGINE_START_TIMEOUT_S = 900.0  # first load of the weights on a slow 2-core machine
DASHBOARD_START_TIMEOUT_S = 120.0
COLLECTOR_START_TIMEOUT_S = 60.0
SETTLE_S = 1.5  # the engine's store writer flushes every 0.5 s
COLLECTOR_INTERVAL_S = 1.0  # the demo's collector decides steps every second
STEPS_WAIT_S = 30.0  # how long a round's summary waits for the collector to store its steps
DEMO_INSTANCE = "demo-engine"  # the engine's name in the store


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="engine + agent workload + dashboard on one machine, printing the URLs")
    add_store_flag(p)
    p.add_argument("--host", default="127.0.0.1", help="address the engine and dashboard listen on")
    p.add_argument("--port", type=port, default=ENGINE_PORT, help="the engine's port")
    p.add_argument("--dashboard-port", type=port, default=DASHBOARD_PORT, help="the dashboard's port")
    p.add_argument(
        "--collector-port",
        type=port,
        default=DEMO_COLLECTOR_PORT,
        help="the collector's OTLP/HTTP port, where the agents send their spans",
    )
    p.add_argument("--num-blocks", type=int, default=48, help="KV blocks of 16 tokens: small, so sessions compete")
    p.add_argument("--max-model-len", type=int, default=640, help="longest prompt + reply the engine accepts")
    p.add_argument("--sessions", type=int, default=8, help="agent sessions per round")
    p.add_argument(
        "--concurrency",
        type=int,
        help=f"sessions running at once (default: {DEFAULT_CONCURRENCY}, fewer where the machine is too slow for it)",
    )
    p.add_argument("--steps", type=int, default=3, help="steps per session")
    p.add_argument("--tool-pause-ms", default="uniform:300-1500", metavar="DIST", help="tool pause (see kvobs agents)")
    p.add_argument(
        "--step-deadline-s",
        type=float,
        help="a step fails when it takes longer (default: fitted to this machine, measured at start: "
        f"{LATER_STEPS_ROOM:g} x the slowest first step, at least {SMALLEST_DEADLINE_S:g} s)",
    )
    p.add_argument("--max-tokens", type=int, default=32, help="reply tokens per step")
    p.add_argument("--seed", type=int, help="workload seed (default: from the clock, so reruns add new sessions)")
    p.add_argument("--rounds", type=int, default=1, help="workload rounds (0: until Ctrl-C)")
    p.add_argument(
        "--otlp-endpoint",
        help="send engine and agent spans (through the collector) here, e.g. a local Jaeger's http://localhost:4317",
    )
    p.add_argument("--jaeger-url", help="Jaeger UI base URL for the dashboard's trace links")
    p.add_argument("--exit-when-done", action="store_true", help="stop everything after the last round")
    p.add_argument(
        "--log-dir", default="kvobs-demo-logs", help="where engine.log, collector.log and dashboard.log are written"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvobs.agent.workload import WorkloadConfig
    from kvobs.store import open_store
    from kvobs.store.db import redacted_url

    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    base_url = f"http://{args.host}:{args.port}"

    def configured() -> WorkloadConfig:
        _check(args)
        config = workload_config(args, base_url=base_url, seed=seed)
        refuse_ports_in_use(_listeners(args).values(), PORTS_HINT)  # every flag first: a bad one costs no probe
        return config

    config = start_or_report("demo", configured)
    if config is None:
        return 2
    store = start_or_report("demo", lambda: open_store(args.store))
    if store is None:
        return 2
    store_url = store.url
    store.close()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    children: list[Child] = []
    logs = start_or_report("demo", lambda: _log_files(args.log_dir))
    if logs is None:
        return 2
    print(f"kvobs demo: logs in {logs['engine'].parent}{os.sep} (engine.log, collector.log, dashboard.log)", flush=True)
    listeners, watch = _listeners(args), None
    starts = [
        ("engine", _engine_command(args, store_url), f"{base_url}/health", ENGINE_START_TIMEOUT_S, "GET"),
        (
            "collector",
            _collector_command(args, store_url),
            f"{_collector_url(args)}/v1/traces",
            COLLECTOR_START_TIMEOUT_S,
            "POST",
        ),
        (
            "dashboard",
            _dashboard_command(args, store_url),
            f"{_dashboard_url(args)}/_stcore/health",
            DASHBOARD_START_TIMEOUT_S,
            "GET",
        ),
    ]
    try:
        fit = _calibrate(args, config, base_url, logs["engine"], stop)
        if fit is None:
            return 0 if stop.is_set() else 1
        config = replace(config, step_deadline_s=fit.step_deadline_s, concurrency=fit.concurrency)
        for name, command, url, timeout_s, method in starts:
            (flag, host, port) = listeners[name]
            taken = ports_in_use([(flag, host, port)])  # again now: another program may have taken it meanwhile
            if taken:
                print(f"kvobs demo: already in use: {', '.join(taken)}; {PORTS_HINT}", file=sys.stderr)
                return 1
            child = start(children, command, logs[name])
            if not wait_ready(child, url, port, timeout_s, stop, f"the {name}", method=method):
                return 0 if stop.is_set() else 1
        _print_urls(args, base_url, _dashboard_url(args), store_url)
        watch = Watch(children, stop)  # a child that exits from here on stops the demo, which exits 1
        _run_rounds(args, config, store_url, stop)
        if watch.failed is not None:
            return 1
        if stop.is_set() or args.exit_when_done:
            return 0
        print(f"\nThe engine and the dashboard stay up: {_dashboard_url(args)}   Ctrl-C stops them.", flush=True)
        stop.wait()
        return 1 if watch.failed is not None else 0
    finally:
        if watch is not None:
            watch.close()
        stopped = stop_all(children)
        if stopped:
            why = "Ctrl-C" if stop.is_set() and (watch is None or watch.failed is None) else "done"
            print(
                f"kvobs demo: {why}: stopped {' and '.join(stopped)}; the store {redacted_url(store_url)} keeps "
                "what they recorded",
                flush=True,
            )


PORTS_HINT = "another kvobs demo? stop it or pass other ports"


def _check(args: argparse.Namespace) -> None:
    from kvobs.agent.workload import check_rounds

    for name in ("num_blocks", "max_model_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    check_rounds(args.rounds)


def _listeners(args: argparse.Namespace) -> dict[str, tuple[str, str, int]]:
    """Each child's listener: (flag, host, port)."""
    return {
        "engine": ("--port", args.host, args.port),
        "collector": ("--collector-port", args.host, args.collector_port),
        "dashboard": ("--dashboard-port", args.host, args.dashboard_port),
    }


def _dashboard_url(args: argparse.Namespace) -> str:
    return f"http://{args.host}:{args.dashboard_port}"


def _kvobs(command: str, flags: dict[str, object]) -> list[str]:
    """`kvobs <command> --flag value ...` run with this Python (the demo's children)."""
    return [sys.executable, "-m", "kvobs.cli", command, *(str(part) for pair in flags.items() for part in pair)]


def _engine_flags(args: argparse.Namespace) -> dict[str, object]:
    """The engine's size and address: the same for the engine that measures the machine and the one that records."""
    return {
        "--host": args.host,
        "--port": args.port,
        "--num-blocks": args.num_blocks,
        "--max-model-len": args.max_model_len,
    }


def _engine_command(args: argparse.Namespace, store_url: str) -> list[str]:
    flags = {**_engine_flags(args), "--store": store_url, "--instance": DEMO_INSTANCE, "--snapshot-interval": 1}
    if args.otlp_endpoint:
        flags["--otlp-endpoint"] = args.otlp_endpoint
    return _kvobs("serve", flags)


def _collector_url(args: argparse.Namespace) -> str:
    return f"http://{args.host}:{args.collector_port}"


def _collector_command(args: argparse.Namespace, store_url: str) -> list[str]:
    """`kvobs collect` as docker-compose.yml runs it for the agents: OTLP in, sessions and steps to the store."""
    from kvobs.telemetry.providers import traces_target

    flags = {
        "--otlp-http": f"{args.host}:{args.collector_port}",
        "--store": store_url,
        "--interval": COLLECTOR_INTERVAL_S,
    }
    if args.otlp_endpoint:
        flags["--forward-otlp"] = traces_target(args.otlp_endpoint)
    return _kvobs("collect", flags)


def _dashboard_command(args: argparse.Namespace, store_url: str) -> list[str]:
    flags = {"--host": args.host, "--port": args.dashboard_port, "--store": store_url}
    if args.jaeger_url:
        flags["--jaeger-url"] = args.jaeger_url
    return _kvobs("dashboard", flags)


def _log_files(log_dir: str) -> dict[str, Path]:
    folder = Path(log_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return {name: folder / f"{name}.log" for name in ("engine", "collector", "dashboard")}


def _calibrate(args: argparse.Namespace, config, base_url: str, log_path: Path, stop: threading.Event):
    """Measure this machine on an engine of the demo's size that records nothing (so its requests are in no figure
    and leave no block in the run's cache), then fit the round's step deadline and concurrency to it; the `Fit`, or
    None (said) when that engine could not start."""
    from kvobs.agent.calibrate import Fit, fit_workload
    from kvobs.agent.workload import measure_first_steps

    print("kvobs demo: measuring this machine on an engine that records nothing (its requests are in no figure)")
    engine: list[Child] = []
    child = start(engine, _kvobs("serve", _engine_flags(args)), log_path)
    try:
        if not wait_ready(child, f"{base_url}/health", args.port, ENGINE_START_TIMEOUT_S, stop, "the engine"):
            return None
        try:
            fit = fit_workload(
                lambda n: measure_first_steps(base_url, n, config.max_tokens),
                concurrency=min(config.concurrency, config.sessions),  # no more at once than a round runs
                deadline_s=args.step_deadline_s,
                concurrency_given=args.concurrency is not None,
            )
        except Exception as exc:  # a measurement, never a reason to stop the demo
            deadline = args.step_deadline_s or UNMEASURED_DEADLINE_S
            print(f"kvobs demo: could not measure the engine ({exc}); the step deadline is {deadline:g} s", flush=True)
            return Fit(deadline, config.concurrency, "not measured", ())
    finally:
        stop_all(engine)
    print(f"kvobs demo: {fit.said}", flush=True)
    return fit


UNMEASURED_DEADLINE_S = 20.0  # where the machine could not be measured: the demo's deadline before it was fitted


def _print_urls(args: argparse.Namespace, base_url: str, dashboard_url: str, store_url: str) -> None:
    lines = [
        f"  dashboard   {dashboard_url}",
        f"  engine API  {base_url}/v1   (OpenAI-compatible; /metrics in vLLM's names)",
        f"  collector   {_collector_url(args)}   (OTLP/HTTP: the agents' spans become sessions and steps)",
        f"  store       {store_url}",
    ]
    if args.jaeger_url:
        lines.insert(1, f"  traces      {args.jaeger_url}")
    print("\nkvobs demo is up:\n" + "\n".join(lines) + "\n", flush=True)


def _run_rounds(args: argparse.Namespace, config, store_url: str, stop: threading.Event) -> None:
    from kvobs.store import open_store

    logging.getLogger("kvobs.telemetry.providers").setLevel(logging.WARNING)  # the URLs above say where spans go
    store = open_store(store_url)  # the demo's reads: the round's steps, hit rate, failures and alerts
    try:
        _rounds(args, config, store, stop)
    finally:
        store.close()


def _rounds(args: argparse.Namespace, config, store, stop: threading.Event) -> None:
    from kvobs.agent.workload import round_configs, session_ids
    from kvobs.commands.agents import run_workload
    from kvobs.telemetry.providers import PROTOCOL_HTTP

    first_started = number = None
    for number, round_config in enumerate(round_configs(config, args.rounds, 0.0, stop), start=1):
        print(
            f"Round {number}: {config.sessions} agent sessions (seed {round_config.seed}), "
            f"{config.concurrency} at a time, {config.steps} steps each, a step deadline of "
            f"{config.step_deadline_s:g} s",
            flush=True,
        )
        started = time.time()
        first_started = first_started or started
        # Like a user's agents: no store, an OTLP endpoint (the collector's). Ctrl-C sets `stop`: each session ends
        # after its current step, and its spans are sent, so what it did is recorded.
        result = run_workload(
            round_config,
            store_url=None,
            otlp_endpoint=_collector_url(args),
            otlp_protocol=PROTOCOL_HTTP,
            stop=stop,
            record=False,
        )
        if result is None:
            return
        own = session_ids(round_config)  # this round's sessions only: another writer's steps are not its own
        stored = _wait_for_steps(store, result.steps, started, own)
        if stop.is_set():
            print(
                f"  interrupted: {stored} of {config.sessions * config.steps} steps recorded in "
                f"{result.wall_s:.0f} s (each session ended after its current step)",
                flush=True,
            )
            return
        if stored < result.steps:
            print(
                f"  the collector stored {stored} of the round's {result.steps} steps within {STEPS_WAIT_S:.0f} s "
                f"(see {Path(args.log_dir) / 'collector.log'}); the summary counts what is stored",
                flush=True,
            )
        _print_round(result, store, started, own)
    if number is not None and number > 1 and first_started is not None:  # what the dashboard's "everything" shows
        print(f"All {number} rounds: {hit_rate_line(store, first_started, time.time())}", flush=True)


def _wait_for_steps(store, expected: int, since: float, own: list[str], timeout_s: float = STEPS_WAIT_S) -> int:
    """The steps of the sessions `own` started since `since`, once the collector has written `expected` of them or
    `timeout_s` has passed."""

    deadline = time.monotonic() + timeout_s
    while True:
        stored = len(store.reads.steps(since, None, session_ids=own))
        if stored >= expected or time.monotonic() > deadline:
            return stored
        time.sleep(0.25)


def _print_round(result, store, started: float, own: list[str]) -> None:
    from kvobs.alerts.evaluator import Evaluator
    from kvobs.alerts.rules import load_rules
    from kvobs.analytics.steps import step_causes

    time.sleep(SETTLE_S)  # the engine writes its requests and KV events in batches
    print(f"  {result.steps} steps in {result.wall_s:.0f} s; {hit_rate_line(store, started, time.time())}")
    steps = store.reads.steps(started, None, session_ids=own)
    print(f"  {_failures_line(step_causes(store, started, None, steps=steps))}")
    transitions = Evaluator(store, load_rules(None)).evaluate(time.time())
    for t in transitions:
        print(f"  alert {t['state']} {t['severity']} {t['rule']}: {t['summary']}")
    if not transitions:
        print("  alerts: no change (the built-in rules hold for minutes before they fire: kvobs alerts --list-rules)")
    sys.stdout.flush()


def hit_rate_line(store, since: float, until: float, instance: str = DEMO_INSTANCE) -> str:
    """The round's prefix-cache hit rate as the terminal says it: the one definition, as the Overview and What-if."""
    from kvobs.analytics.cache import hit_rate_in
    from kvobs.times import local_time

    rate = hit_rate_in(store, since, until, instances=[instance]).describe()
    return f"prefix cache hit rate: {rate} ({instance}, {local_time(since)} to {local_time(until)})"


def _failures_line(causes) -> str:
    """Failed steps split into what the cache (or queue) explains, model errors and the rest, with slow steps."""
    from kvobs.analytics.steps import CAUSE_LABELS, failure_split

    split = failure_split(causes)
    slow = causes[causes["slow"].astype(bool)] if not causes.empty else causes
    slow_by_cause = slow["slow_cause"].value_counts() if not slow.empty else {}
    slow_text = ", ".join(f"{CAUSE_LABELS.get(cause, 'not explained')} {n}" for cause, n in slow_by_cause.items())
    failed = sum(split.values())
    timeouts = ", ".join(f"{words} {split[kind]}" for kind, words in TIMEOUT_KINDS.items() if split[kind])
    return (
        f"failed steps: {failed} (timeouts: {timeouts or 'none'}; model errors: {split['model']}, request errors: "
        f"{split['request']})\n  slow steps: {len(slow)}" + (f" (what cost the time: {slow_text})" if len(slow) else "")
    )


# a timeout's kind (`attribution.FAILURE_KINDS`) as the terminal says what cost it
TIMEOUT_KINDS = {
    "queue": "the queue",
    "cache": "the KV cache",
    "engine": "the engine's prefill or decode",
    "tool": "their own tools",
    "outside": "outside the engine",
    "timeout": "not split (no request found)",
}
