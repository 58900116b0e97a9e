"""Two real vLLM servers (the CPU build, 128-token blocks, the same sha256 block hashes) under `kvobs agents
--routing round_robin`, recorded (tests/fixtures/fleet-vllm-cpu) and pushed through one collector. The truth is
vLLM's own: each request's cached prompt tokens as its response said them (`usage.prompt_tokens_details`, on the
agent's step), which no KV event or analysis of ours produced. The residency the analysis rebuilds from the replicas'
KV events finds exactly those hits, request for request; a routing loss it finds is confirmed by the holding
replica's own hit on the session's next request there; the what-if's `as_routed` router reproduces each replica's
hits; the collector's meter writes what the replay finds."""

from __future__ import annotations

import pytest

from instrumented_engine.whatif.fleet import FleetPlan, simulate_fleet
from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.cache.routing import fleet_losses
from kvobs.analytics.cache.shortfall_split import store_lookups
from kvobs.semconv.spans import KVEventKind
from tests.collectors.fleet_recording import REPLICAS, cached_said
from tests.runs import measured_copy, missing_as_none

BLOCK = 128  # vLLM's CPU build


@pytest.fixture
def fleet(vllm_fleet):
    store = vllm_fleet.store
    first, last = store.reads.time_range()
    losses, check = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    return store, losses, check


def test_each_request_lands_on_its_replica_with_its_session(vllm_fleet):
    store = vllm_fleet.store
    reqs = with_sessions(store.reads.requests(), store.reads.steps())
    assert len(reqs) == 24 and reqs["instance"].value_counts().to_dict() == dict.fromkeys(REPLICAS, 12)
    assert reqs["session_id"].notna().all() and reqs["session_id"].nunique() == 6
    assert len(cached_said(store)) == 24  # every request is its step's


def test_the_replicas_hashes_meet_and_every_request_is_compared(fleet):
    store, losses, check = fleet
    assert check.notes == [] and check.block_sizes == dict.fromkeys(REPLICAS, BLOCK)
    assert len(losses) == 24 and (losses["replicas_compared"] == 1).all()


def test_the_resident_prefix_on_its_own_replica_is_what_vllm_found(fleet):
    """vLLM's request spans carry no cached tokens, so each request's own hit is its replica's resident prefix at
    its lookup, rebuilt from the KV events: it is what vLLM's own response said, for every request."""
    store, losses, _ = fleet
    said = cached_said(store)
    assert {r: n * BLOCK for r, n in zip(losses["request_id"], losses["own_blocks"])} == said
    assert sum(said.values()) > 0


def test_a_routing_loss_is_what_the_holding_replica_then_found_itself(fleet):
    """No block was ever removed (the caches never filled), so what a replica held at one lookup it held at every
    later one: a routed request's blocks held by the other replica are found there by the session's next request
    on it, as vLLM itself said."""
    store, losses, _ = fleet
    assert set(store.reads.kv_events()["kind"]) == {KVEventKind.STORED.value}
    said = cached_said(store)
    reqs = with_sessions(store.reads.requests(), store.reads.steps()).set_index("request_id")
    routed = losses[losses["routed_blocks"] > 0]
    assert len(routed) >= 1 and routed["routed_tokens"].sum() == BLOCK * routed["routed_blocks"].sum()
    confirmed = 0
    for row in routed.itertuples(index=False):
        assert row.best_blocks == row.own_blocks + row.routed_blocks and row.best_instance != row.instance
        session = reqs.loc[reqs["session_id"] == reqs.loc[row.request_id, "session_id"]]
        later = session[(session["instance"] == row.best_instance) & (session["arrival_ts"] > row.lookup_ts)]
        if not later.empty:
            next_there = later.sort_values("arrival_ts").index[0]
            assert said[next_there] >= row.best_blocks * BLOCK, (row.request_id, next_there)
            confirmed += 1
    assert confirmed >= 1


def test_the_as_routed_router_reproduces_each_replicas_hits(vllm_fleet):
    store = vllm_fleet.store
    said = cached_said(store)
    reqs = store.reads.requests()
    expected = {name: sum(said[r] for r in group["request_id"]) for name, group in reqs.groupby("instance")}
    observed = simulate_fleet(FleetPlan.from_store(store), "as_routed")
    assert {name: r.hit_tokens for name, r in observed.per_replica.items()} == expected


def test_the_collectors_meter_writes_what_the_replay_finds(vllm_fleet, tmp_path):
    store = measured_copy(vllm_fleet, tmp_path)
    whole, _ = store_lookups(store, store.reads.requests(), store.reads.steps(), None, None)
    measured = store.reads.request_lookups().set_index("request_id").sort_index()
    whole = whole.set_index("request_id").loc[measured.index]
    assert len(measured) == len(whole) == 24
    for column in ("own_blocks", "routed_blocks", "cold_blocks", "available_blocks", "best_instance"):
        assert missing_as_none(measured[column]) == missing_as_none(whole[column]), column
    assert measured["routed_blocks"].sum() > 0
    store.close()
