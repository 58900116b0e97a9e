"""`kvobs agents` as a user runs it: bad flags and an unreachable server end in one line and exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from sqlalchemy import select

from kvobs.store import open_store
from kvobs.store.schema import StepRow
from tests.server.conftest import free_port, running_server
from tests.waiting import wait_for

AGENTS = [sys.executable, "-m", "kvobs.cli", "agents"]
SMALL_RUN = "--sessions 2 --steps 2 --max-tokens 2 --tool-pause-ms 50 --seed 3"  # two sessions of two short steps


def agents(*flags: str, **kwargs) -> subprocess.CompletedProcess:
    """`kvobs agents FLAGS --no-progress` in a process of its own, to its end."""
    return subprocess.run([*AGENTS, *flags, "--no-progress"], capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sessions", "0"], "--sessions must be at least 1"),
        (["--tool-pause-ms", "soon"], "not a pause distribution: 'soon'"),
        (["--tool-pause-ms", "uniform:900-100"], "the upper bound is below the lower one"),
        (["--step-deadline-s", "-1"], "--step-deadline-s must be positive"),
        (["--rounds", "-1"], "--rounds must be 0 (until stopped) or more"),
        (["--seed", "soon"], "not a seed: 'soon' (an integer, or 'clock')"),
        ([], "cannot reach http://127.0.0.1:"),
    ],
)
def test_bad_flags_and_unreachable_server_exit_2(tmp_path, flags, message):
    done = agents(
        "--base-url",
        f"http://127.0.0.1:{free_port()}",
        "--store",
        f"sqlite:///{tmp_path / 's.db'}",
        *flags,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


def test_rounds_until_sigterm_give_each_round_new_sessions_and_flush(smollm2_source, tmp_path):
    url = f"sqlite:///{tmp_path / 'rounds.db'}"
    store = open_store(url)

    def steps() -> list[tuple[str, int]]:
        with store.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(select(StepRow.session_id, StepRow.step_index))]

    with running_server(smollm2_source) as server:
        rounds = "--rounds 0 --round-pause-s 0.1 --sessions 1 --steps 2 --max-tokens 2 --tool-pause-ms 50 --seed 7"
        proc = subprocess.Popen(
            [*AGENTS, "--base-url", server.url, "--store", url, *rounds.split(), "--no-progress"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: len(steps()) >= 4, timeout_s=180)  # two whole rounds written
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    rounds = [line for line in out.splitlines() if line.startswith("seed ")]
    assert len(rounds) >= 2 and all("1 sessions, 2 steps" in line for line in rounds[:2]), out
    assert [line.split(":")[0] for line in rounds] == [f"seed {7 + i}" for i in range(len(rounds))]
    written = steps()
    store.close()
    seeds = sorted({session.rsplit("-", 2)[1] for session, _ in written})
    assert seeds == [str(7 + i) for i in range(len(seeds))] and len(seeds) >= 2  # seed + round: new sessions
    assert len(written) == len(set(written)) <= 2 * len(seeds)  # a round cut short by SIGTERM ends early


def test_no_store_needs_an_otlp_endpoint(tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = agents("--base-url", "http://127.0.0.1:1", "--no-store", timeout=120, cwd=tmp_path, env=environment)
    assert done.returncode == 2 and "--no-store needs --otlp-endpoint" in done.stderr, done.stderr


def test_no_store_agents_reach_the_store_through_the_collector(smollm2_source, store, tmp_path):
    """`kvobs agents --no-store --otlp-endpoint` (as docker-compose runs it): no store of its own, the collector
    writes its sessions and steps from its spans."""
    from collectors.collector import Collector, CollectorOptions

    grpc, here = free_port(), tmp_path / "agents"
    here.mkdir()
    collector = Collector(CollectorOptions(otlp_grpc=f"127.0.0.1:{grpc}", interval_s=0.5, settle_s=1.0), store=store)
    collector.start()
    try:
        with running_server(smollm2_source) as server:
            done = agents(
                "--base-url",
                server.url,
                "--no-store",
                "--otlp-endpoint",
                f"http://127.0.0.1:{grpc}",
                *SMALL_RUN.split(),
                timeout=300,
                cwd=here,
            )
            assert done.returncode == 0, done.stderr
            # no deadline given: fitted to the server first, said with what the measurement sent and when
            assert "so the step deadline is" in done.stderr
            assert f"The measurement sent 2 requests with no session to {server.url}" in done.stderr
        wait_for(lambda: collector.span_steps.by_source["sdk"] >= 4, timeout_s=30)
    finally:
        collector.stop()
    assert not list(here.iterdir())  # no store file of its own
    sessions = store.reads.sessions()
    assert len(sessions) == 2 and set(sessions["source"]) == {"sdk"} and sessions["ended_at"].notna().all()
    steps = store.reads.steps()
    assert sorted(steps.groupby("session_id")["step_index"].apply(list).tolist()) == [[0, 1], [0, 1]]
