"""The time before the engine, on scripted runs of the real engine whose truth is known (`tests.analytics.scripted`):
a step whose request reached the server late in its deadline, and steps whose request never reached it.

- `unreached` (`tests.runs`): a's third step's request reaches the server 2.2 s into its 3 s, and the deadline passes
  in its prefill (the engine aborts it: an `abort` row); b's second step's request never reaches the server, and
  b's third does after it; d's last step never reaches it either, and nothing is heard from the server after it.
- `unaborted`: the same never-sent step on a server with no abandoned request in its record.
"""

from __future__ import annotations

import pytest

from kvobs.analytics.steps.causes import step_causes
from kvobs.analytics.steps.latency_parts import PARTS
from kvobs.analytics.steps.unreached import NOT_KNOWN
from tests.analytics.scripted import Script, tokens_of, verdicts
from tests.runs import UNREACHED_DEADLINE_S as DEADLINE_S
from tests.runs import UNREACHED_REACHED_S as REACHED_S
from tests.runs import good_step


@pytest.fixture(scope="module")
def unaborted(smollm2_source, tmp_path_factory):
    s = Script.start(smollm2_source, tmp_path_factory.mktemp("unaborted") / "run.db", num_blocks=128)
    e = good_step(s, "e", 0, tokens_of(3, 64))
    s.unsent("e", 1, DEADLINE_S)
    good_step(s, "e", 2, e)
    return s, s.close()


def test_a_request_that_reached_the_server_late_is_named_by_the_time_before_it(unreached):
    script, store = unreached
    frame = verdicts(store)
    row = frame.loc[("a", 2)]
    req = store.reads.requests().set_index("request_id").loc["a-2"]
    # truth: it arrived 2.2 s in, its prefill ran past the deadline, the engine aborted it
    assert req["arrival_ts"] - row["started_at"] == pytest.approx(REACHED_S)
    assert req["finish_reason"] == "abort"
    assert (row["status"], row["error_type"]) == ("error", "timeout")
    assert row["before_s"] == pytest.approx(REACHED_S)
    assert 0 < row["prefill_s"] < row["before_s"]  # the smaller part, which the verdict named before
    assert (row["failure_cause"], row["failure_kind"]) == ("before_server", "outside"), row["evidence"]
    assert "before its request reached the server" in row["evidence"]
    assert f"its request reached the server {REACHED_S:.2f} s into the step" in row["evidence"]
    assert sum(row[p] for p in PARTS) == pytest.approx(row["latency_s"])
    good = frame[frame["status"] == "ok"]
    assert (good["before_s"] < 0.05).all()  # each arrived `CLIENT_S` after its step began


def test_a_request_that_never_reached_the_server_is_named_so_where_the_server_would_have_recorded_it(unreached):
    script, store = unreached
    frame = verdicts(store)
    row = frame.loc[("b", 1)]
    assert (
        not store.reads.requests(session_id="b")
        .query("arrival_ts >= @row.started_at")["request_id"]
        .isin(["b-1"])
        .any()
    )
    assert row["num_requests"] == 0
    assert (row["failure_cause"], row["failure_kind"]) == ("never_reached_server", "outside"), row["evidence"]
    assert f"its request never reached the server in its {DEADLINE_S:.2f} s" in row["evidence"]
    assert "scripted (1 abandoned requests recorded)" in row["evidence"]  # the evidence: a-2's abort row
    assert row["before_s"] == pytest.approx(DEADLINE_S) and row["other_s"] == 0
    # d's last step: nothing from the server after it, so its record may simply have stopped: not claimed
    last = frame.loc[("d", 1)]
    assert (last["failure_cause"], last["failure_kind"]) == ("timeout", "timeout")
    assert NOT_KNOWN in last["evidence"]


def test_a_missing_request_is_not_called_unsent_where_the_server_records_no_abandoned_request(unaborted):
    script, store = unaborted
    assert not (store.reads.requests()["finish_reason"] == "abort").any()
    row = verdicts(store).loc[("e", 1)]
    assert (row["failure_cause"], row["failure_kind"]) == ("timeout", "timeout")
    assert NOT_KNOWN in row["evidence"]


def test_the_keeper_stores_the_time_before_the_server_and_the_step_page_shows_it(unreached, monkeypatch):
    """What the verdict keeper writes (`verdict_records`) holds `before_s` through the store; the step page of the
    step that never reached the server says so."""
    from kvobs.analytics.steps.verdicts import verdict_records
    from kvobs.store import StoreWriter
    from tests.dashboard.test_app import step_page_text

    script, store = unreached
    attributed = step_causes(store, None, None)
    writer = StoreWriter(store)
    writer.add_many(verdict_records(attributed, decided_at=float(attributed["started_at"].max()) + 60))
    writer.close()
    stored = store.reads.step_verdicts(None, None).set_index(["session_id", "step_index"])
    assert stored.loc[("a", 2), "before_s"] == pytest.approx(REACHED_S)
    assert stored.loc[("b", 1), "failure_cause"] == "never_reached_server"

    assert "its request never reached the server" in step_page_text(monkeypatch, store.url, "b", 1)
