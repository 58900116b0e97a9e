"""`kvobs demo`, the README's second command, as a user runs it: it brings up the engine and the dashboard, prints
their URLs, runs the agents into the store, stays up until Ctrl-C, and then stops its children and flushes."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from sqlalchemy import select

from kvobs.store import open_store
from kvobs.store.schema import RequestRow, SessionRow, StepRow
from tests.server.conftest import free_port

READY_LINE = "The engine and the dashboard stay up"
PORT_FLAGS = ("--port", "--dashboard-port", "--collector-port")


def demo(store_url: str, ports: dict[str, int] | None = None, **options) -> list[str]:
    """`kvobs demo` on `store_url` with `options` as flags (`tool_pause_ms=200`: `--tool-pause-ms 200`), every port
    free unless `ports` names it."""
    ports = ports or {}
    command = [sys.executable, "-m", "kvobs.cli", "demo", "--store", store_url]
    for flag in PORT_FLAGS:
        command += [flag, str(ports.get(flag) or free_port())]
    for name, value in options.items():
        command += ["--" + name.replace("_", "-"), str(value)]
    return command


def _read_until(proc: subprocess.Popen, marker: str, timeout_s: float) -> str:
    """Stdout up to the line holding `marker` (read in a thread, so a hung demo fails the test on time)."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    found.wait(timeout_s)
    return "".join(lines)


def test_demo_serves_engine_and_dashboard_runs_the_agents_and_stops_cleanly(tmp_path):
    port, dashboard_port, collector_port = free_port(), free_port(), free_port()
    store_url = f"sqlite:///{tmp_path / 'demo.db'}"
    ports = {"--port": port, "--dashboard-port": dashboard_port, "--collector-port": collector_port}
    options = {"sessions": 3, "concurrency": 3, "steps": 2, "seed": 5, "tool_pause_ms": 200}
    command = demo(store_url, ports, log_dir=tmp_path / "logs", **options)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = _read_until(proc, READY_LINE, timeout_s=600)
        assert READY_LINE in out, (out, proc.poll())
        # the children's logs are in the files the demo named, not between its own lines
        assert f"logs in {tmp_path / 'logs'}" in out
        engine_log, collector_log, dashboard_log = (
            (tmp_path / "logs" / f"{n}.log").read_text() for n in ("engine", "collector", "dashboard")
        )
        assert "kvobs engine serving" in engine_log
        assert f"kvobs dashboard on http://127.0.0.1:{dashboard_port}" in dashboard_log
        # the agents' spans reach the store the way a user's do: through the collector, which the demo started
        assert f"collecting into {store_url}: OTLP HTTP :{collector_port}" in collector_log
        assert "kvobs engine serving" not in out and "kvobs dashboard on" not in out and "collecting into" not in out
        assert f"dashboard   http://127.0.0.1:{dashboard_port}" in out
        assert f"engine API  http://127.0.0.1:{port}/v1" in out
        assert f"collector   http://127.0.0.1:{collector_port}   (OTLP/HTTP" in out
        assert "6 steps in" in out and "prefix cache hit rate: " in out
        # the machine measured first, on an engine that records nothing, and the round's deadline fitted to it
        assert "measuring this machine on an engine that records nothing" in out
        assert "a later step carries a longer context, so the step deadline is" in out
        fitted = re.search(r"so the step deadline is ([\d.]+) s", out).group(1)
        assert f"3 at a time, 2 steps each, a step deadline of {fitted} s" in out
        # While it stays up, both answer on the printed URLs.
        assert httpx.get(f"http://127.0.0.1:{dashboard_port}/_stcore/health", timeout=10).text == "ok"
        page = httpx.get(f"http://127.0.0.1:{dashboard_port}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
        assert "vllm:kv_cache_usage_perc" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        proc.send_signal(signal.SIGINT)  # Ctrl-C on an idle demo says what it stopped
        rest, err = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert (
            "kvobs demo: Ctrl-C: stopped the dashboard and the collector and the engine; the store "
            f"{store_url} keeps what they recorded"
        ) in rest
        assert "kvobs engine serving" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
    for url in (
        f"http://127.0.0.1:{port}/health",
        f"http://127.0.0.1:{dashboard_port}/_stcore/health",
        f"http://127.0.0.1:{collector_port}/v1/traces",
    ):
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, timeout=5)  # the children are gone
    store = open_store(store_url)
    with store.engine.connect() as conn:
        steps = conn.execute(select(StepRow.session_id, StepRow.trace_id)).all()
        request_traces = set(conn.execute(select(RequestRow.trace_id)).scalars())
        request_sessions = set(conn.execute(select(RequestRow.session_id)).scalars())
        sources = dict(conn.execute(select(SessionRow.session_id, SessionRow.source)).all())
    store.close()
    assert sorted({s for s, _ in steps}) == ["coder-5-0001", "planner-5-0002", "researcher-5-0000"]
    assert len(steps) == 6
    assert sources == dict.fromkeys(["coder-5-0001", "planner-5-0002", "researcher-5-0000"], "sdk")
    assert {t for _, t in steps} <= request_traces  # the engine flushed a request for every step, in its trace
    assert None not in request_sessions  # the measurement's requests went to an engine that records nothing


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num-blocks", "0"], "--num-blocks must be positive"),
        (["--sessions", "0"], "--sessions must be at least 1"),
        (["--store", "mysql+nodriver://x/y"], "kvobs demo:"),
    ],
)
def test_bad_flags_exit_2_in_one_line(tmp_path, flags, message):
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "demo", "--store", f"sqlite:///{tmp_path / 's.db'}", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_ports_already_in_use_stop_the_demo_before_it_starts_anything_all_named_at_once(tmp_path):
    with socket.socket() as engine, socket.socket() as dashboard:
        ports = []
        for taken in (engine, dashboard):  # e.g. an engine and a dashboard left over from an earlier run
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            ports.append(taken.getsockname()[1])
        command = demo(f"sqlite:///{tmp_path / 's.db'}", ports={"--port": ports[0], "--dashboard-port": ports[1]})
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert (
        f"already in use: 127.0.0.1:{ports[0]} (--port), 127.0.0.1:{ports[1]} (--dashboard-port); another kvobs "
        "demo? stop it or pass other ports"
    ) in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "s.db").exists()


def test_an_engine_that_cannot_start_stops_the_demo_with_its_reason(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        demo(f"sqlite:///{tmp_path / 's.db'}", num_blocks=8, log_dir=tmp_path / "logs"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "--num-blocks 8 of 16 tokens cannot hold one sequence of --max-model-len 640" in done.stderr
    assert "the engine exited with status 2 before it was ready" in done.stderr
    assert "kvobs demo is up" not in done.stdout and time.monotonic() - started < 300


def test_ctrl_c_mid_round_says_how_many_steps_were_recorded_and_they_are_in_the_store(tmp_path):
    store_url = f"sqlite:///{tmp_path / 'demo.db'}"
    # a round that outlasts the 4 s before Ctrl-C: 8 steps of 1.5 s pauses each (a step whose prompt outgrew the
    # engine's context fails at once, with no pause, so a long session would end in seconds)
    options = {"sessions": 2, "concurrency": 2, "steps": 8, "tool_pause_ms": 1500, "max_tokens": 4}
    command = demo(store_url, log_dir=tmp_path / "logs", **options)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = _read_until(proc, "Round 1:", timeout_s=600)
        assert "Round 1:" in out, (out, proc.poll())
        time.sleep(4)  # some steps done, most not
        proc.send_signal(signal.SIGINT)  # Ctrl-C mid-round
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    line = next(line for line in rest.splitlines() if "interrupted:" in line)
    recorded = int(line.split("interrupted:")[1].split()[0])
    assert 0 < recorded < 16 and "of 16 steps recorded" in line
    store = open_store(store_url)
    with store.engine.connect() as conn:
        assert len(conn.execute(select(StepRow.session_id)).all()) == recorded
    store.close()


def test_two_demos_on_the_same_ports_never_claim_a_dead_child(tmp_path):
    """Two demos started 5 s apart on one host's ports: each finds them free at its start, but the other's engine
    binds only once it has loaded. The one that keeps the ports runs its round (and, its step deadline too short for
    this machine, says so with the flag to pass); the other never prints that it is up, says which child died, and
    exits 1; neither takes the other's servers for its own."""
    ports = {flag: free_port() for flag in PORT_FLAGS}
    options = {"sessions": 1, "concurrency": 1, "steps": 1, "seed": 3, "tool_pause_ms": 100, "step_deadline_s": 0.5}
    procs = []
    for name in ("a", "b"):
        command = demo(f"sqlite:///{tmp_path / (name + '.db')}", ports, log_dir=tmp_path / name, **options)
        procs.append(
            subprocess.Popen([*command, "--exit-when-done"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
        time.sleep(5)
    try:
        outcomes = [proc.communicate(timeout=900) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    codes = [proc.returncode for proc in procs]
    assert sorted(codes) == [0, 1], (codes, outcomes)
    (won_out, _), (lost_out, lost_err) = outcomes[codes.index(0)], outcomes[codes.index(1)]
    assert "kvobs demo is up" in won_out and "1 steps in" in won_out
    # 0.5 s: too short for this machine, said with what leaving the flag out would choose
    assert "--step-deadline-s 0.5 will fail many steps for the machine's speed" in won_out
    assert "Without the flag it is fitted to the machine" in won_out
    assert "kvobs demo is up" not in lost_out
    assert "exited with status" in lost_err or "already in use" in lost_err, lost_err
