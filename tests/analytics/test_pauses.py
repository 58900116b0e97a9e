"""The hit rate against the pause before each step, and the TTL pin's curve (`kvobs.analytics.steps.pauses`), on our
engine's run under the agent workload (tool pauses of 0.2-0.6 s) and on a recorded smolagents agent traced by
OpenInference, whose steps record the tools that ran in each pause."""

from __future__ import annotations

import json

import pytest

from kvobs.analytics.steps.pauses import NO_TOOL, default_ttls, not_measured, pin_curve, step_pauses
from tests.collectors.test_agent_fixtures import FIXTURES, exports, replay


def test_each_step_after_a_pause_with_its_hit_rate(agent_run):
    steps, requests = agent_run.store.reads.steps(), agent_run.store.reads.requests()
    frame = step_pauses(steps, requests)
    assert len(frame) == len(steps) - steps["session_id"].nunique()  # every step but each session's first
    assert (frame["pause_s"] >= 0.2).all()  # at least the workload's tool pause: the agent waited that long
    by_step = steps.set_index(["session_id", "step_index"])
    for row in frame.itertuples(index=False):
        step = by_step.loc[(row.session_id, row.step_index)]
        assert row.hit_rate == pytest.approx(step["cached_tokens"] / step["prompt_tokens"])  # its usage's
        # one request a step here, the session's k-th for its step k: from the previous one's finish to its arrival
        ours = requests[requests["session_id"] == row.session_id].sort_values("arrival_ts")
        mine, previous = ours.iloc[row.step_index], ours.iloc[row.step_index - 1]
        assert row.pause_s == pytest.approx(mine["arrival_ts"] - previous["finished_ts"])
        named = [t["name"] for t in json.loads(step["tools"])] if isinstance(step["tools"], str) else []
        assert row.tool == ("+".join(dict.fromkeys(named)) or NO_TOOL)  # the tools the SDK recorded in the pause
    assert frame["tool"].ne(NO_TOOL).all() and not_measured(frame) == 0
    shortest, longest = frame["pause_s"].min(), frame["pause_s"].max()
    curve = pin_curve(frame, [shortest / 2, frame["pause_s"].median(), longest])
    assert list(curve["step_share"]) == [0.0, pytest.approx(0.5, abs=0.1), 1.0]
    assert list(curve["token_share"])[-1] == 1.0
    ttls = default_ttls(frame)
    assert ttls[0] == pytest.approx(shortest) and ttls[-1] == pytest.approx(longest)
    assert pin_curve(frame, ttls)["step_share"].is_monotonic_increasing


def test_a_framework_agents_pauses_name_their_tools(store):
    """smolagents' steps: the tool each pause ran (`steps.tools`, from its OpenInference tool spans); its spans say
    no cached tokens, so no step's hit rate is claimed: each is counted as not measured."""
    replay(store, exports("smolagents-openinference"))
    frame = step_pauses(store.reads.steps(), store.reads.requests())
    recorded = json.loads((FIXTURES / "smolagents-openinference" / "steps.json").read_text())["steps"]
    tools = {(s["session_id"], s["step_index"]): s["tools"] for s in recorded}
    assert len(frame) > 0
    for row in frame.itertuples(index=False):
        named = [t["name"] for t in json.loads(tools[(row.session_id, row.step_index)] or "[]")]
        assert row.tool == ("+".join(dict.fromkeys(named)) or NO_TOOL)
    assert {"search_flights", "book_hotel"} <= set(frame["tool"])
    assert not_measured(frame) == frame["cached_tokens"].isna().sum()
