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
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from kvobs.commands.common import add_store_flag, refuse_ports_in_use, start_or_report, workload_config
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
    p.add_argument("--port", type=int, default=ENGINE_PORT, help="the engine's port")
    p.add_argument("--dashboard-port", type=int, default=DASHBOARD_PORT, help="the dashboard's port")
    p.add_argument(
        "--collector-port",
        type=int,
        default=DEMO_COLLECTOR_PORT,
        help="the collector's OTLP/HTTP port, where the agents send their spans",
    )
    p.add_argument("--num-blocks", type=int, default=48, help="KV blocks of 16 tokens: small, so sessions compete")
    p.add_argument("--max-model-len", type=int, default=640, help="longest prompt + reply the engine accepts")
    p.add_argument("--sessions", type=int, default=8, help="agent sessions per round")
    p.add_argument("--concurrency", type=int, default=4, help="sessions running at once")
    p.add_argument("--steps", type=int, default=3, help="steps per session")
    p.add_argument("--tool-pause-ms", default="uniform:300-1500", metavar="DIST", help="tool pause (see kvobs agents)")
    p.add_argument("--step-deadline-s", type=float, default=20.0, help="a step fails when it takes longer")
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
        return workload_config(args, base_url=base_url, seed=seed)

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
    children: list[_Child] = []
    logs = start_or_report("demo", lambda: _log_files(args.log_dir))
    if logs is None:
        return 2
    print(f"kvobs demo: logs in {logs['engine'].parent}{os.sep} (engine.log, collector.log, dashboard.log)", flush=True)
    try:
        engine = _start(children, _engine_command(args, store_url), logs["engine"])
        if not _wait_ready(engine, f"{base_url}/health", ENGINE_START_TIMEOUT_S, stop, "the engine"):
            return 0 if stop.is_set() else 1
        collector = _start(children, _collector_command(args, store_url), logs["collector"])
        if not _wait_ready(
            collector,
            f"{_collector_url(args)}/v1/traces",
            COLLECTOR_START_TIMEOUT_S,
            stop,
            "the collector",
            method="POST",
        ):
            return 0 if stop.is_set() else 1
        dashboard_url = f"http://{args.host}:{args.dashboard_port}"
        dashboard = _start(children, _dashboard_command(args, store_url), logs["dashboard"])
        if not _wait_ready(
            dashboard, f"{dashboard_url}/_stcore/health", DASHBOARD_START_TIMEOUT_S, stop, "the dashboard"
        ):
            return 0 if stop.is_set() else 1
        _print_urls(args, base_url, dashboard_url, store_url)
        _run_rounds(args, config, store_url, stop)
        if stop.is_set() or args.exit_when_done:
            return 0
        print(f"\nThe engine and the dashboard stay up: {dashboard_url}   Ctrl-C stops them.", flush=True)
        while not stop.wait(1.0):
            for child in children:
                if child.poll() is not None:
                    print(
                        f"kvobs demo: kvobs {child.command} exited with status {child.returncode}{_log_tail(child)}",
                        file=sys.stderr,
                    )
                    return 1
        return 0
    finally:
        stopped = _stop_all(children)
        if stopped:
            why = "Ctrl-C" if stop.is_set() else "done"
            print(
                f"kvobs demo: {why}: stopped {' and '.join(stopped)}; the store {redacted_url(store_url)} keeps "
                "what they recorded",
                flush=True,
            )


def _check(args: argparse.Namespace) -> None:
    from kvobs.agent.workload import check_rounds

    for name in ("num_blocks", "max_model_len"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    check_rounds(args.rounds)
    ports = [
        ("--port", args.port),
        ("--dashboard-port", args.dashboard_port),
        ("--collector-port", args.collector_port),
    ]
    refuse_ports_in_use(
        [(flag, args.host, port) for flag, port in ports], "another kvobs demo? stop it or pass other ports"
    )  # every taken port in one message


def _kvobs(command: str, flags: dict[str, object]) -> list[str]:
    """`kvobs <command> --flag value ...` run with this Python (the demo's children)."""
    return [sys.executable, "-m", "kvobs.cli", command, *(str(part) for pair in flags.items() for part in pair)]


def _engine_command(args: argparse.Namespace, store_url: str) -> list[str]:
    flags = {
        "--host": args.host,
        "--port": args.port,
        "--num-blocks": args.num_blocks,
        "--max-model-len": args.max_model_len,
        "--store": store_url,
        "--instance": DEMO_INSTANCE,
        "--snapshot-interval": 1,
    }
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


class _Child(subprocess.Popen):
    """A child of the demo: its kvobs command's name and the log file it writes."""

    command: str
    log_path: Path


def _start(children: list[_Child], command: list[str], log_path: Path) -> _Child:
    # A session of its own: Ctrl-C reaches only us, and we stop the children in order (the engine flushes).
    with open(log_path, "ab") as log_file:  # the child holds its own descriptor
        log_file.write(f"\n--- kvobs demo started: {' '.join(command[2:])}\n".encode())
        log_file.flush()
        child = _Child(
            command, start_new_session=True, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
    child.command, child.log_path = command[3], log_path
    children.append(child)
    return child


def _log_tail(child: _Child, num_lines: int = 15) -> str:
    path = child.log_path
    if not path.exists():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-num_lines:]
    return f"\nthe last lines of {path}:\n" + "\n".join("  " + line for line in lines)


def _wait_ready(
    child: _Child, url: str, timeout_s: float, stop: threading.Event, what: str, method: str = "GET"
) -> bool:
    """Whether `child` answers `url` (to a POST any HTTP answer: a ready collector takes the empty export)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        if child.poll() is not None:
            print(
                f"kvobs demo: {what} exited with status {child.returncode} before it was ready{_log_tail(child)}",
                file=sys.stderr,
            )
            return False
        try:
            status = httpx.request(method, url, timeout=2.0).status_code
            if status == 200 or method == "POST":
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            print(
                f"kvobs demo: {what} did not answer {url} within {timeout_s:.0f} s{_log_tail(child)}", file=sys.stderr
            )
            return False
        stop.wait(0.5)
    return False


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
    from kvobs.agent.workload import round_configs
    from kvobs.commands.agents import run_workload
    from kvobs.telemetry.providers import PROTOCOL_HTTP

    for number, round_config in enumerate(round_configs(config, args.rounds, 0.0, stop), start=1):
        print(
            f"Round {number}: {config.sessions} agent sessions (seed {round_config.seed}), "
            f"{config.concurrency} at a time, {config.steps} steps each",
            flush=True,
        )
        started = time.time()
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
        stored = _wait_for_steps(store, result.steps, started)
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
        _print_round(result, store, started)


def _wait_for_steps(store, expected: int, since: float, timeout_s: float = STEPS_WAIT_S) -> int:
    """The steps started since `since` in the store, once the collector has written `expected` or `timeout_s` has
    passed."""

    deadline = time.monotonic() + timeout_s
    while True:
        stored, _ = store.lookups.step_counts(since, time.time())
        if stored >= expected or time.monotonic() > deadline:
            return stored
        time.sleep(0.25)


def _print_round(result, store, started: float) -> None:
    from kvobs.alerts.evaluator import Evaluator
    from kvobs.alerts.rules import load_rules
    from kvobs.analytics.step_causes import step_causes

    time.sleep(SETTLE_S)  # the engine writes its requests and KV events in batches
    print(f"  {result.steps} steps in {result.wall_s:.0f} s; {hit_rate_line(store, started, time.time())}")
    print(f"  {_failures_line(step_causes(store, started, None))}")
    transitions = Evaluator(store, load_rules(None)).evaluate(time.time())
    for t in transitions:
        print(f"  alert {t['state']} {t['severity']} {t['rule']}: {t['summary']}")
    if not transitions:
        print("  alerts: no change (the built-in rules hold for minutes before they fire: kvobs alerts --list-rules)")
    sys.stdout.flush()


def hit_rate_line(store, since: float, until: float, instance: str = DEMO_INSTANCE) -> str:
    """The round's prefix-cache hit rate as the terminal says it: the one definition, as the Overview and What-if."""
    from kvobs.analytics.hit_rate import hit_rate_in

    return f"prefix cache hit rate: {hit_rate_in(store, since, until, instances=[instance]).describe()} ({instance})"


def _failures_line(causes) -> str:
    """Failed steps split into what the cache (or queue) explains, model errors and the rest, with slow steps."""
    from kvobs.analytics.attribution import failure_split
    from kvobs.analytics.latency_parts import CAUSE_LABELS

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


def _stop_all(children: list[_Child]) -> list[str]:
    """Stop the children still running, the dashboard first, the engine last (it flushes); return what was stopped,
    in words."""
    stopped = [_NAMES.get(child.command, child.command) for child in reversed(children) if child.poll() is None]
    for child in reversed(children):
        if child.poll() is None:
            _signal_group(child, signal.SIGTERM)  # its whole session: nothing it started outlives the demo
    for child in reversed(children):
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("kvobs %s did not stop within 30 s; killing it", child.command)
            _signal_group(child, signal.SIGKILL)
            child.wait()
    return stopped


_NAMES = {"serve": "the engine", "collect": "the collector", "dashboard": "the dashboard"}


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited in the meantime
        os.killpg(child.pid, sig)
