"""Which request stored which blocks, where the blocks name no session (`kvobs.analytics.cache.ownership`), checked
against runs whose blocks do name their sessions (the header reached the server): the same stored blocks with
their names taken away must be given back exactly the sessions the server wrote on them, or none; never another.
The runs: a real vLLM 0.32 under 12 concurrent agents (5 preemptions), two real vLLM replicas behind a round-robin
router, `kvobs serve` under pressure (evictions, preemptions) and a `kvobs serve` fleet."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pandas as pd
import pytest

from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.cache.ownership import block_ties, owned_stored, tied_sessions
from kvobs.analytics.cache.routing import ROUTING_KINDS, routing_losses
from kvobs.analytics.cache.tie_reports import session_ties, ties_check
from kvobs.semconv.spans import BlockTie
from kvobs.store import StoreWriter

INFERENCE, HEADER = BlockTie.INFERENCE.value, BlockTie.HEADER.value


def blind(store):
    """The run's requests with the sessions their steps give them, and its stored blocks, as written and with no
    session named."""
    reqs = with_sessions(store.reads.requests(), store.reads.steps())
    stored = store.reads.stored_blocks()
    return reqs, stored, stored.assign(session_id=None)


# run, requests tied, blocks owned by inference (of all stored), requests a session is found for by the reverse tie;
# None for a live run (`agent_run`: its timing differs run to run): nearly every request tied or all its prompt
# cached (sessions running at once may store two chains of one depth in one window: the inference declines to choose
# between them, `ambiguous`, and owns neither), most of its blocks owned, at least one session found the other way
CASES = [
    ("vllm_run", {INFERENCE: 51, BlockTie.AMBIGUOUS.value: 6}, (198, 205), 12),
    ("vllm_fleet", {INFERENCE: 15, BlockTie.STORED_NOTHING.value: 9}, (16, 16), 15),
    ("served_fleet", {INFERENCE: 12}, (113, 113), 12),
    ("agent_run", None, None, None),
]


@pytest.mark.parametrize("run,tied,owned_of,reversed_", CASES, ids=[c[0] for c in CASES])
def test_blocks_owned_by_inference_are_the_sessions_the_header_named(request, run, tied, owned_of, reversed_):
    reqs, stored, unnamed = blind(request.getfixturevalue(run).store)
    ties = block_ties(reqs, unnamed)
    if tied is None:
        known = {INFERENCE, BlockTie.STORED_NOTHING.value, BlockTie.AMBIGUOUS.value}
        assert set(ties["tie"]) <= known and (ties["tie"] == INFERENCE).mean() >= 0.75, ties["tie"].value_counts()
    else:
        assert ties["tie"].value_counts().to_dict() == tied
    owned = owned_stored(unnamed, ties)
    inferred = owned["tie"] == INFERENCE
    assert (owned.loc[inferred, "session_id"] == stored.loc[inferred, "session_id"]).all()  # never another's
    assert (owned.loc[~inferred, "session_id"].isna()).all()
    if owned_of is None:
        assert inferred.sum() >= 0.7 * len(stored)
    else:
        assert (int(inferred.sum()), len(stored)) == owned_of
    # each tied request owns its chain from its tip up to the prefix it found cached
    assert ties.loc[ties["tie"] == INFERENCE, "num_blocks"].sum() >= inferred.sum()

    # the other way: requests with no session take the one their blocks name, where exactly one chain fits
    vllm_requests = reqs.assign(session_id=None)
    back = tied_sessions(vllm_requests, block_ties(vllm_requests, stored)).set_index("request_id")["session_id"]
    truth = reqs.set_index("request_id")["session_id"]
    found = back.notna()
    assert int(found.sum()) == reversed_ if reversed_ is not None else found.any()
    known = found & truth.notna()
    assert (back[known] == truth[known]).all()


def test_a_request_without_counts_or_a_stream_is_never_tied(vllm_run):
    reqs, stored, unnamed = blind(vllm_run.store)
    ties = block_ties(reqs.assign(completion_tokens=None), unnamed)
    assert set(ties["tie"]) == {BlockTie.NO_COUNTS.value} and ties["session_id"].isna().all()
    two = unnamed.assign(instance=["a", "b"] * (len(unnamed) // 2) + ["a"] * (len(unnamed) % 2))
    other = block_ties(reqs.assign(instance="elsewhere"), two)  # two streams, neither the requests' instance
    assert set(other["tie"]) == {BlockTie.NO_COUNTS.value}
    assert owned_stored(unnamed, other)["session_id"].isna().all()


def test_blocks_whose_chain_root_was_not_read_are_not_tied(vllm_run):
    """Blocks read without their chain's root have no known depth: their requests say so, and a range read from a
    run's middle ties only what it can, rightly."""
    reqs, stored, unnamed = blind(vllm_run.store)
    rootless = unnamed[unnamed["parent_hash"].notna()]
    ties = block_ties(reqs, rootless)
    assert set(ties["tie"]) == {BlockTie.NO_CHAIN.value}
    assert owned_stored(rootless, ties)["session_id"].isna().all()
    later = unnamed[unnamed["ts"] > unnamed["ts"].median()]
    owned = owned_stored(later, block_ties(reqs[reqs["arrival_ts"] > later["ts"].min()], later))
    named = owned["session_id"].notna()
    assert named.any() and (owned.loc[named, "session_id"] == stored.loc[owned.index[named], "session_id"]).all()


def test_a_tie_is_stated_as_header_where_the_blocks_named_the_session(vllm_run):
    reqs, stored, _ = blind(vllm_run.store)
    ties = block_ties(reqs, stored)
    given = ties["request_id"].map(reqs.set_index("request_id")["session_id"]).notna()
    assert set(ties.loc[given & ties["session_id"].notna(), "tie"]) == {HEADER}
    # the request after the reset, sent by no recorded step, takes the session its blocks name
    assert ties.loc[~given & ties["session_id"].notna(), "session_id"].tolist() == ["sess-after-reset"]
    assert owned_stored(stored, ties)["tie"].eq(HEADER).all()
    assert pd.isna(ties.loc[ties["tie"] == BlockTie.STORED_NOTHING.value, "tip_hash"]).all()


@pytest.mark.parametrize("run", ["vllm_fleet", "served_fleet"])
def test_routing_loss_is_measured_the_same_where_the_blocks_name_no_session(request, run):
    """Two replicas behind a router: each request's prefix lookup (its own hit, the longest prefix another replica
    held, the routing loss) measured from blocks that name no session equals the one from the header's names."""
    store = request.getfixturevalue(run).store
    reqs = with_sessions(store.reads.requests(), store.reads.steps())
    events = store.reads.kv_events(kinds=ROUTING_KINDS)
    named = routing_losses(reqs, events)
    assert len(named) and named["best_blocks"].sum() > 0
    pd.testing.assert_frame_equal(routing_losses(reqs, events.assign(session_id=None)), named)
    unknown = routing_losses(reqs.assign(session_id=None), events.assign(session_id=None))
    assert unknown.empty  # no session on the requests either: a request's chain is read by its session's blocks


def test_where_only_some_sessions_sent_the_header_the_others_are_given_back_and_the_named_keep_theirs(vllm_run):
    """A fleet where half the agents send the header: the named blocks stay their sessions' (never given to
    another session's request that could have stored them), the others are tied by inference, none wrongly."""
    reqs, stored, _ = blind(vllm_run.store)
    half = stored["session_id"].isin({f"sess-{i:02d}" for i in range(6)})
    mixed = stored.assign(session_id=stored["session_id"].where(~half, None))
    owned = owned_stored(mixed, block_ties(reqs, mixed))
    assert (owned.loc[~half, "tie"] == HEADER).all()
    inferred = owned["tie"] == INFERENCE
    assert inferred.sum() >= 0.9 * half.sum() and set(owned.loc[inferred].index) <= set(stored.index[half])
    assert (owned.loc[inferred, "session_id"] == stored.loc[inferred, "session_id"]).all()


def test_doctor_names_a_collector_whose_requests_mostly_went_untied(vllm_run):
    """The requests of the vLLM run whose blocks' names were taken away, but no step to give them sessions: most
    are ambiguous or have no session, and `kvobs doctor --collector` says so, with the fix."""
    reqs, _, unnamed = blind(vllm_run.store)
    ties = block_ties(reqs.assign(session_id=None), unnamed)
    sessionless = (ties["tie"] == INFERENCE) & ties["session_id"].isna()  # the collector counts them `no_session`
    ok, words = ties_check(ties["tie"].where(~sessionless, "no_session").value_counts().to_dict())
    assert not ok and "not tied" in words and "send X-Session-ID to own them exactly" in words, words
    fine, said = ties_check(block_ties(reqs, unnamed)["tie"].value_counts().to_dict())
    assert fine and said == (
        "of 57 requests whose KV blocks named no session, 51 tied or all cached; 6 not tied (6 of them: more than one "
        "chain fit, or one another request's fit too; send X-Session-ID to own them exactly)"
    )


@pytest.mark.parametrize("backend", ["sqlite", "chdb"])
def test_a_sessions_ties_are_read_where_its_blocks_named_no_session_and_none_where_they_all_did(
    vllm_run, tmp_path, backend
):
    """`session_ties` (the Sessions page's) over the vLLM run as written (every store named its session: nothing to
    tie) and with the stores of six sessions written without their names: those sessions' requests are tied by
    inference, on SQLite and in ClickHouse's engine, and `stored_blocks(unnamed=True)` is exactly the unnamed rows."""
    from tests.store.test_contract import _open, _rows

    records = _rows(vllm_run.store)
    half = {f"sess-{i:02d}" for i in range(6)}
    records["kv_events"] = [
        replace(r, session_id=None) if r.kind == "stored" and r.session_id in half else r for r in records["kv_events"]
    ]
    store, _ = _open(backend, tmp_path)
    writer = StoreWriter(store)
    for table, rows in records.items():
        for row in rows:
            (writer.upsert if table == "sessions" else writer.add)(row)
    writer.close()
    try:
        unnamed = store.reads.stored_blocks(unnamed=True)
        stored = store.reads.stored_blocks()
        assert len(unnamed) == stored["session_id"].isna().sum() > 0 and unnamed["session_id"].isna().all()
        assert session_ties(vllm_run.store, "sess-00") == Counter()  # as written: the header named every block
        assert session_ties(store, "sess-07") == Counter()  # a session that sent the header
        ties = session_ties(store, "sess-00")
        assert ties[INFERENCE] > 0 and HEADER not in ties
        # A header session's request that stored nothing new, or whose window held two chains of its depth, is no
        # tie to speak of: its session's blocks name it (read from the blocks), so the page says nothing of ties
        # (it once said "its blocks named no session" of such SDK sessions).
        requests = with_sessions(store.reads.requests(), store.reads.steps())
        raw = block_ties(requests, store.reads.stored_blocks())
        named = {f"sess-{i:02d}" for i in range(6, 12)}
        session_of = requests.set_index("request_id")["session_id"]
        assert not raw[(raw["tie"] != HEADER) & raw["request_id"].map(session_of).isin(named)].empty
        for session in named:
            assert session_ties(store, session) == Counter(), session
    finally:
        store.close()


def test_a_session_whose_prompt_does_not_grow_by_appending_is_tied_by_its_own_depth_and_times(tmp_path):
    """Another tenant's calls on the real vLLM six-session run (`vllm-six-sessions-kv`): seven prompts of one length
    under one name, each new from its first block (so no call's chain continues the one before), no step of theirs.
    The session's chain says nothing of such a pair, so each is tied by its own depth and times, to the session its
    blocks name; once a pair that did not continue emptied both their candidates, and all seven read ambiguous."""
    from collectors.capture import import_capture
    from kvobs.store import open_store
    from tests.collectors.agent_harness import FIXTURES

    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    import_capture(store, FIXTURES / "vllm-six-sessions-kv")
    reqs, stored, _ = blind(store)
    ties = block_ties(reqs, stored).merge(reqs[["request_id", "prompt_tokens"]], on="request_id")
    tenant = ties[ties["prompt_tokens"] == 1476]  # (the tenant's calls: one length, `_tenant` in test_live_vllm)
    # (no step names their session: each takes the one its blocks name, where one chain fits)
    assert len(tenant) == 7 and set(tenant["tie"]) == {INFERENCE} and set(tenant["session_id"]) == {"tenant"}
    assert Counter(ties["tie"]) == Counter({HEADER: 18, INFERENCE: 7})
