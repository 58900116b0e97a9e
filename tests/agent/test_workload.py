"""The agent workload: what `--seed` fixes, how pauses are drawn, and `run_workload` (what `kvobs agents` runs)
against the real server, whose steps must join the engine's requests by trace even with no OTLP export."""

from __future__ import annotations

import random

import pytest

from kvobs.agent.workload import PauseDistribution, WorkloadConfig, parse_json_reply, session_plan, tool_result
from kvobs.commands.agents import run_workload
from kvobs.store import open_store
from tests.server.conftest import running_server


def test_seed_fixes_sessions_tasks_pauses_and_tool_results():
    pauses = PauseDistribution.parse("lognormal:500,0.8")

    def draw(seed):
        out = []
        for i in range(6):
            session_id, kind, rng = session_plan(seed, i)
            out.append((session_id, kind.name, pauses.sample_s(rng), tool_result(rng, "search")))
        return out

    assert draw(7) == draw(7) and draw(7) != draw(8)
    assert [kind for _, kind, _, _ in draw(7)][:3] == ["researcher", "coder", "planner"]


@pytest.mark.parametrize(
    ("text", "low", "high"),
    [
        ("250", 0.25, 0.25),
        ("const:250", 0.25, 0.25),
        ("uniform:100-300", 0.1, 0.3),
        ("exp:200", 0.0, 10.0),
        ("lognormal:200,0.5", 0.0, 10.0),
    ],
)
def test_pause_distributions_draw_in_range(text, low, high):
    dist, rng = PauseDistribution.parse(text), random.Random(0)
    draws = [dist.sample_s(rng) for _ in range(2000)]
    assert low <= min(draws) and max(draws) <= high
    if text.startswith("exp"):
        assert abs(sum(draws) / len(draws) - 0.2) < 0.02  # the mean, in seconds
    if text.startswith("lognormal"):
        assert abs(sorted(draws)[1000] - 0.2) < 0.02  # the median


def test_json_replies():
    assert parse_json_reply('Sure: {"thought": "x", "tool": "flights"} done') == {"thought": "x", "tool": "flights"}
    assert parse_json_reply('{"thought": "cut off') is None and parse_json_reply("[1, 2]") is None


def test_run_workload_records_steps_that_join_the_engines_requests(smollm2_source, tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    with running_server(smollm2_source, options={"store_url": url, "instance": "engine-wl"}) as server:
        config = WorkloadConfig(
            base_url=server.url,
            sessions=2,
            concurrency=2,
            steps=2,
            max_tokens=4,
            seed=3,
            tool_pause=PauseDistribution.parse("50"),
        )
        result = run_workload(config, store_url=url, otlp_endpoint=None, progress=False)
    assert result.sessions == 2 and result.steps == 4
    store = open_store(url)
    steps, reqs = store.reads.steps(), store.reads.requests()
    assert len(steps) == 4 and len(reqs) == 4
    assert (steps["trace_id"].str.strip("0") != "").all()  # real ids without an exporter
    assert set(steps["trace_id"]) == set(reqs["trace_id"])  # each session's trace reaches the engine
    assert set(steps["session_id"]) == set(reqs["session_id"]) == {"researcher-3-0000", "coder-3-0001"}
