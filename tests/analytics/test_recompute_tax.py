"""The recompute tax: hand-computed, and on our engine's run, where preemptions are known from two sides."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from kvobs.analytics.cache import (
    FLEET,
    PREEMPTION_KINDS,
    preemption_recompute,
    range_preemptions,
    range_tax,
    shortfall_of_sums,
    tax_table,
    tax_words,
)
from kvobs.store.rollups import LOOKUP_TOKENS


def _sums(instance: str, **tokens) -> dict:
    return {"instance": instance, "requests": 1, **dict.fromkeys(LOOKUP_TOKENS, 0), **tokens}


def _event(kind: str, request: str, instance: str, tokens: int, reason=None) -> dict:
    row = {"kind": kind, "request_id": request, "session_id": "s", "instance": instance}
    return {**row, "num_tokens": tokens, "reason": reason}


def test_the_tax_by_hand():
    # a: 1,000 prompt tokens in whole blocks, 400 found; of the 600 prefilled, 200 were never stored before (cold)
    # and 400 were recomputed: 160 in tool pauses, 96 capacity, 64 routing, 48 invalidated, 32 unexplained.
    # Its engine says its preemptions: r1 lost 96 tokens and found 32 again (64 recomputed), r2 lost 48 and found 64
    # (nothing). b: 500, 100 found, 300 cold, 100 capacity; its counter counted 2 preemptions it does not detail.
    a_parts = {"cold": 200, "pause": 160, "capacity": 96, "routed": 64, "invalidated": 48, "unexplained": 32}
    a_tokens = {f"{part}_tokens": n for part, n in a_parts.items()}
    b_tokens = {"cold_tokens": 300, "capacity_tokens": 100}
    sums = pd.DataFrame(
        [
            _sums("a", prompt_block_tokens=1000, achieved_tokens=400, available_tokens=800, **a_tokens),
            _sums("b", prompt_block_tokens=500, achieved_tokens=100, available_tokens=200, **b_tokens),
        ]
    )
    events = pd.DataFrame(
        [
            _event("hit", "r1", "a", 0),
            _event("preempted", "r1", "a", 96),
            _event("hit", "r1", "a", 32, "readmission"),
            _event("preempted", "r2", "a", 48),
            _event("hit", "r2", "a", 64, "readmission"),
        ]
    )
    preempted = preemption_recompute(events, {"b": 2.0})
    assert preempted.measured == {"a": True, "b": False}
    by_instance = preempted.by("instance", ["a", "b"])
    assert by_instance == {"a": 64.0, "b": None, FLEET: None}
    tax = tax_table(shortfall_of_sums(sums, "instance"), "instance", by_instance).set_index("instance")
    a, b, fleet = tax.loc["a"], tax.loc["b"], tax.loc[FLEET]
    assert (a["prefill_tokens"], a["recomputed_tokens"]) == (664, 464)
    assert a["recompute_tax"] == pytest.approx(464 / 664)
    assert [a[f"recomputed_{c}_tokens"] for c in ("pause", "capacity", "routed", "invalidated", "unexplained")] == [
        160,
        96,
        64,
        48,
        32,
    ]
    assert a["recomputed_preempted_tokens"] == 64
    assert (b["prefill_tokens"], b["recomputed_tokens"], b["recompute_tax"]) == (400, 100, 0.25)
    assert math.isnan(b["recomputed_preempted_tokens"])  # counted, not detailed: not measured, never 0
    assert (fleet["prefill_tokens"], fleet["recomputed_tokens"]) == (1000, 500)
    assert tax_words(a).startswith("69.9% of 664 prefilled tokens were recomputed (464: tool pauses 160, capacity 96")
    assert "preemption's recompute not measured" in tax_words(b)
    # b's counter saying no preemption: measured, 0
    assert preemption_recompute(events, {"b": 0.0}).by("instance", ["a", "b"]) == {"a": 64.0, "b": 0.0, FLEET: 64.0}


def test_a_session_on_an_engine_that_does_not_say_its_preemptions_is_not_measured():
    events = pd.DataFrame([_event("hit", "r1", "a", 0)])
    preempted = preemption_recompute(events)
    assert preempted.by("session_id", ["s1", "s2"], served={"s1": {"a"}, "s2": {"vllm"}}) == {
        "s1": 0.0,
        "s2": None,
        FLEET: None,
    }


def test_on_the_engine_run_the_preempted_requests_are_those_the_requests_say(agent_run):
    """Our engine's run (30 blocks: sessions preempt each other): the requests whose recompute is counted are the
    preempted ones by their own rows (`num_preemptions`, from the request path), each recomputing something; the
    tax's lookup parts are the shortfall split's, and it adds up."""
    store = agent_run.store
    preempted = range_preemptions(store, None, None)
    requests = store.reads.requests()
    said = set(requests.loc[requests["num_preemptions"] > 0, "request_id"])
    assert said and set(preempted.requests["request_id"]) == said
    assert preempted.measured == {"engine-test": True}
    tax = range_tax(store, None, None).set_index("instance")
    row = tax.loc[FLEET]
    recomputed = sum(row[f"recomputed_{c}_tokens"] for c in ("pause", "capacity", "routed", "invalidated"))
    recomputed += row["recomputed_unexplained_tokens"] + row["recomputed_preempted_tokens"]
    assert row["recomputed_tokens"] == recomputed > 0
    assert row["recomputed_preempted_tokens"] == preempted.requests["tokens"].sum() > 0
    assert row["recomputed_pause_tokens"] > 0  # the sessions lost blocks in their tool pauses
    assert 0 < row["recompute_tax"] < 1
    events = store.reads.kv_events(kinds=PREEMPTION_KINDS)
    assert len(events[events["kind"] == "preempted"]) >= len(said)
