"""The whole step judged: parts that add up to its latency, and the part that cost a timeout named, on runs whose
truth is known (scripted runs of the real engine on a virtual clock: `tests.analytics.scripted`), and on every
recorded run.

- `overload`: the engine runs one request at a time; a long reply holds it while two sessions' next steps arrive
  with a 1 s deadline: they are never scheduled, their clients hang up at the deadline, and the engine aborts them.
  Meanwhile the long reply's growth evicted a waiting session's cached prefix.
- `preempt`: two sessions decode long replies in a cache too small for both: the later one is preempted and
  re-admitted only once the other has finished.
- `slow_decode`: a session's third step decodes while the machine runs at an eighth of its speed; its fourth does
  too, with a deadline that passes mid-decode.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from instrumented_engine.engine import events as ev
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.analytics.steps.causes import step_causes
from kvobs.analytics.steps.latency_parts import ESTIMATES, PARTS
from tests.analytics.scripted import CLIENT_S, Script, tokens_of, verdicts
from tests.runs import OVERLOAD_DEADLINE_S as DEADLINE_S
from tests.runs import TOOL_S


@pytest.fixture(scope="module")
def preempt(smollm2_source, tmp_path_factory):
    path = tmp_path_factory.mktemp("preempt") / "run.db"
    s = Script.start(smollm2_source, path, num_blocks=33, max_num_seqs=4, max_model_len=512)
    contexts = {}
    for n, session in enumerate(["x", "p"]):  # each alone: as long a reply as p's next, without contention
        rid = s.send(session, 0, tokens_of(n, 64), 120, tool_s=TOOL_S)
        s.finish()
        s.idle(TOOL_S + 0.05)
        contexts[session] = s.context(rid) + tokens_of(n + 10, 16)
    s.send("x", 1, contexts["x"], 250)  # admitted first: it grows, the later one gives way
    s.step()
    s.send("p", 1, contexts["p"], 120)
    s.finish()
    return s, s.close()


@pytest.fixture(scope="module")
def slow_decode(smollm2_source, tmp_path_factory):
    s = Script.start(smollm2_source, tmp_path_factory.mktemp("slow-decode") / "run.db", num_blocks=96)
    context = tokens_of(0, 64)
    for index in range(4):
        deadline = 2.0 if index == 3 else None
        rid = s.send("d", index, context, 24, deadline_s=deadline, tool_s=TOOL_S)
        s.step()  # its prefill and first token
        s.clock.slow = 8.0 if index >= 2 else 1.0  # the machine slows down while it decodes
        s.finish()
        s.clock.slow = 1.0
        s.idle(TOOL_S + 0.05)
        context = s.context(rid) + tokens_of(index + 1, 16)
    return s, s.close()


def test_a_step_never_scheduled_before_its_deadline_is_named_by_the_queue(overload):
    script, store = overload
    frame = verdicts(store)
    reqs = store.reads.requests().set_index("request_id")
    for session in ("q1", "q2"):
        req, row = reqs.loc[f"{session}-1"], frame.loc[(session, 1)]
        # truth: aborted at the client's deadline, never scheduled
        assert req["finish_reason"] == "abort" and pd.isna(req["queue_s"]) and pd.isna(req["first_token_ts"])
        assert (row["status"], row["error_type"]) == ("error", "timeout")
        assert row["latency_s"] == pytest.approx(DEADLINE_S)
        step_end = row["started_at"] + DEADLINE_S  # the client hung up there; the engine aborted it at its next step
        assert step_end <= req["finished_ts"] < step_end + 0.1
        assert row["queue_s"] == pytest.approx(step_end - req["arrival_ts"])  # arrival to the end: queue
        assert row["before_s"] == pytest.approx(CLIENT_S) and row["prefill_s"] == row["decode_s"] == 0
        assert row["other_s"] == pytest.approx(0.0, abs=1e-9)
        assert (row["failure_cause"], row["failure_kind"]) == ("queue_wait", "queue")
        assert row["never_scheduled"]
        assert row["evidence"].startswith(f"timed out after {DEADLINE_S:.2f} s: waiting in the queue, 0.99 s of it")
        assert "was never scheduled" in row["evidence"]
    # the long reply's growth took a waiting session's cached prefix: a loss, said, and not what cost the timeout
    lost = [frame.loc[(s, 1)] for s in ("q1", "q2") if frame.loc[(s, 1), "blocks_lost_in_pause"] > 0]
    assert lost, "the script meant the long reply to evict a waiting session's prefix"
    for row in lost:
        assert (
            "evicted during the" in row["evidence"]
            and "not recomputed: its request was never scheduled" in (row["evidence"])
        )
        assert row["lost_recompute_s"] == 0


def test_a_long_reply_is_a_long_reply_and_tools_are_the_steps_own(overload):
    script, store = overload
    frame = verdicts(store)
    row = frame.loc[("long", 1)]
    out = script.outputs["long-1"]
    assert row["decode_s"] == pytest.approx(out.finished_ts - out.first_token_ts)
    assert row["slow"] and row["slow_cause"] == "long_decode"  # as fast per token as usual, 150 tokens not 4
    ok = frame[frame["status"] == "ok"]
    assert np.allclose(ok["tool_s"], TOOL_S)  # the tool it ran after its reply, not "outside the engine"
    assert np.allclose(ok["before_s"], CLIENT_S, atol=1e-6)  # from its start to its request's arrival
    assert np.allclose(ok["other_s"], 0.002, atol=1e-6)  # the reply's way back (epoch-second floats)


def test_a_step_preempted_and_readmitted_late_is_named_by_the_preemption(preempt):
    script, store = preempt
    preempted = [e for e in script.raw_events if isinstance(e, ev.Preempted)]
    readmitted = [e for e in script.raw_events if isinstance(e, ev.PrefixLookup) and e.readmission]
    assert preempted and {e.request_id for e in preempted} == {"p-1"}  # truth: the later one gave way
    waits = [min(r.ts for r in readmitted if r.ts >= p.ts) - p.ts for p in preempted]
    frame = verdicts(store)
    row = frame.loc[("p", 1)]
    assert row["preemption"] == "measured" and row["preemptions"] == len(preempted)
    assert row["preempted_s"] >= sum(waits) - 1e-9  # every wait to be re-admitted, measured
    assert row["preempted_s"] <= row["latency_s"]
    assert row["slow"] and row["slow_cause"] == "preempted"
    assert "measured from the engine's" in row["evidence"]
    # each part traceable to its events: the waits as the engine's own preemption and re-admission times tell them
    start = row["started_at"]
    for p in preempted:
        back = min(r.ts for r in readmitted if r.ts >= p.ts)
        assert f"preempted {p.ts - start:.2f} s into the step, re-admitted at {back - start:.2f} s" in row["evidence"]
    rest = row["preempted_s"] - sum(waits)
    assert f"of which {sum(waits):.2f} s waiting to be re-admitted" in row["evidence"]
    assert f"and {rest:.2f} s of compute it threw away or redid" in row["evidence"]
    # the same step, timed out: the preemption cost it the deadline
    steps = store.reads.steps()
    failed = steps.assign(
        status=np.where((steps["session_id"] == "p") & (steps["step_index"] == 1), "error", steps["status"]),
        error_type=np.where((steps["session_id"] == "p") & (steps["step_index"] == 1), "timeout", None),
    )
    again = attribute_steps(failed, store.reads.requests(), store.reads.kv_events(kinds=ATTRIBUTION_KINDS))
    row = again.set_index(["session_id", "step_index"]).loc[("p", 1)]
    assert (row["failure_cause"], row["failure_kind"]) == ("preempted", "cache")
    assert row["evidence"].startswith("timed out after") and "preemption" in row["evidence"]


def test_a_decode_slower_than_usual_is_named_by_the_decode(slow_decode):
    script, store = slow_decode
    frame = verdicts(store)
    usual = frame.loc[("d", 1)]
    slow = frame.loc[("d", 2)]
    assert slow["decoded_tokens"] == usual["decoded_tokens"] == 23  # the same reply length: only the pace differs
    assert slow["decode_s"] == pytest.approx(8 * usual["decode_s"], rel=0.05)
    assert slow["slow"] and slow["slow_cause"] == "slow_decode"
    late = frame.loc[("d", 3)]  # the deadline passed mid-decode: the client hung up, the engine aborted it
    req = store.reads.requests().set_index("request_id").loc["d-3"]
    assert req["finish_reason"] == "abort" and req["completion_tokens"] < 24
    assert late["latency_s"] == pytest.approx(2.0)
    assert (late["failure_cause"], late["failure_kind"]) == ("slow_decode", "engine")
    assert late["evidence"].startswith("timed out after 2.00 s: decoding slower per token than usual")


RUNS = ["agent_run", "vllm_run", "fleet_run", "served_fleet", "vllm_fleet", "overload", "preempt", "slow_decode"]


@pytest.mark.parametrize("run", RUNS)
def test_the_parts_add_up_to_the_latency_on_every_step(run, request):
    fixture = request.getfixturevalue(run)
    store = fixture[1] if isinstance(fixture, tuple) else fixture.store
    frame = step_causes(store, None, None)
    assert len(frame) > 0
    assert frame["latency_s"].notna().all()
    parts = frame[list(PARTS)]
    assert (parts >= 0).all().all()
    np.testing.assert_allclose(parts.sum(axis=1), frame["latency_s"], atol=1e-6)  # every part measured, once
    assert (frame[list(ESTIMATES)].sum(axis=1) <= frame["prefill_s"] + 1e-9).all()  # recompute: inside the prefill
    assert (frame["new_prefill_s"] >= -1e-9).all()


def test_the_whatif_observed_row_counts_recompute_as_the_replay_does(overload):
    """A request aborted before it was ever scheduled looked nothing up and recomputed nothing: the observed row
    counts it so, as the replay does (it once counted its session's whole chain as recomputed)."""
    from instrumented_engine.whatif.replay import ReplayPlan, simulate

    script, store = overload
    plan = ReplayPlan.from_store(store)
    replay = simulate(plan, num_blocks=24)
    assert plan.observed["recompute_tokens"] == replay.recompute_tokens
    assert plan.observed["hit_rate"] == pytest.approx(replay.hit_rate)


def _all_timed_out(source, path, *, with_a_good_session: bool):
    """Two sessions of four steps, one at a time, each step with a 1 s deadline that passes mid-decode: every step
    times out, its decode holding most of its time; each prompt longer than the last and new (no prefix cached),
    so the later steps prefill longer than the earlier ones. With `with_a_good_session`, a session of short replies
    that all succeed runs first."""
    s = Script.start(source, path, num_blocks=128, max_num_seqs=1, max_model_len=512)
    if with_a_good_session:
        for index in range(3):
            s.send("good", index, tokens_of(12 + index, 64), 8, tool_s=TOOL_S)
            s.finish()
            s.idle(TOOL_S + 0.05)
    for n, session in enumerate(["a", "b"]):
        for index in range(4):
            s.send(session, index, tokens_of(4 * n + index, 64 + 48 * index), 300, deadline_s=1.0)
            s.finish()
            s.idle(TOOL_S)
    return s.close()


@pytest.mark.parametrize("with_a_good_session", [False, True])
def test_a_timeout_is_weighed_only_against_steps_that_succeeded(
    smollm2_source, tmp_path, monkeypatch, with_a_good_session
):
    """Every step of sessions a and b timed out with its decode holding most of its 1 s. Against the other timeouts,
    a later step's longer prefill was its 'excess' (its decode was shorter than theirs), and the verdict said
    `long_prefill`; a timeout has no typical among timeouts. With no other step of its session succeeded, each is
    named by its largest part, and says so, whether or not another session's steps succeeded (a baseline that
    depended on which sessions a page read with it would give the Sessions page and the verdict keeper two
    verdicts); that session's own steps are judged among themselves."""
    store = _all_timed_out(smollm2_source, tmp_path / "run.db", with_a_good_session=with_a_good_session)
    frame = verdicts(store)
    for session in ("a", "b"):
        for index in range(4):
            row = frame.loc[(session, index)]
            assert (row["status"], row["error_type"]) == ("error", "timeout")
            assert row["decode_s"] > max(row[p] for p in PARTS if p != "decode_s")  # truth: the decode consumed it
            assert (row["failure_cause"], row["failure_kind"]) == ("long_decode", "engine"), row["evidence"]
            assert "its largest part: no other step of its session succeeded to compare it with" in row["evidence"]
            assert not row["slow"] and np.isnan(row["typical_s"])
    if with_a_good_session:
        good = frame.loc["good"]
        assert (good["status"] == "ok").all() and not good["slow"].any()
    # the step page says there is no typical step, rather than printing an empty one
    from tests.dashboard.test_app import step_page_text

    said = step_page_text(monkeypatch, store.url, "a", 2)
    assert "no typical step: no other successful step of its session" in said and "against a typical" not in said


@pytest.fixture(scope="module")
def sizes(smollm2_source, tmp_path_factory):
    """Session m: three short steps (32-token prompts), two long ones (480), each new (no prefix cached) with an
    8-token reply, then a long one whose 100-token reply passes its 1 s deadline mid-decode. Session n: three short
    steps, then the same long timeout: none of its successful steps is of its size."""
    s = Script.start(smollm2_source, tmp_path_factory.mktemp("sizes") / "run.db", num_blocks=128, max_num_seqs=1)
    seed = iter(range(12))
    for session, lengths in (("m", [32, 32, 32, 480, 480]), ("n", [32, 32, 32])):
        for index, n in enumerate(lengths):
            s.send(session, index, tokens_of(next(seed), n), 8, tool_s=TOOL_S)
            s.finish()
            s.idle(TOOL_S + 0.05)
        s.send(session, len(lengths), tokens_of(next(seed), 480), 100, deadline_s=1.0)
        s.finish()
        s.idle(TOOL_S)
    return s, s.close()


def test_a_timeout_is_weighed_against_successful_steps_of_its_kind_and_size(sizes):
    """m-5's 480-token prefill is as long as m-3's and m-4's; its reply, longer than theirs, is what passed the
    deadline. Against the median of all m's successful steps (three of them short) its prefill would be the larger
    excess; against the steps of its size it is as usual, and the decode is named. n-3 has no successful step of its
    size: it is named by its largest part (its prefill, with nothing cached), and says why."""
    _, store = sizes
    frame = verdicts(store)
    row, long_steps = frame.loc[("m", 5)], [frame.loc[("m", i)] for i in (3, 4)]
    assert (row["status"], row["error_type"]) == ("error", "timeout")
    # truth: the same prefill as the successful steps of its size, a longer decode
    assert row["prefill_s"] == pytest.approx(np.median([r["prefill_s"] for r in long_steps]), rel=0.01)
    assert row["decode_s"] > 2 * max(r["decode_s"] for r in long_steps)
    everyone = frame.loc["m"].iloc[:5]
    against_all = {p: row[p] - everyone[p].median() for p in ("prefill_s", "decode_s")}
    assert against_all["prefill_s"] > against_all["decode_s"]  # the wrong baseline would name the prefill
    assert (row["failure_cause"], row["failure_kind"]) == ("long_decode", "engine"), row["evidence"]
    assert row["typical_prefill_s"] == pytest.approx(row["prefill_s"], rel=0.01)
    said = "more than usual, against the median of its session's 2 successful steps of its kind and size (1 request"
    assert said in row["evidence"]
    lone = frame.loc[("n", 3)]
    assert (lone["status"], lone["error_type"]) == ("error", "timeout")
    assert np.isnan(lone["typical_s"]) and not lone["slow"]
    assert lone["prefill_s"] > max(lone[p] for p in PARTS if p != "prefill_s")  # truth: a new 480-token prompt
    assert (lone["failure_cause"], lone["failure_kind"]) == ("cold_prefix", "engine"), lone["evidence"]
    assert "its largest part: none of its session's 3 successful steps is of its kind and size" in lone["evidence"]
