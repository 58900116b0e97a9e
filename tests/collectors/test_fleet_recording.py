"""The recorded two-replica run through one collector: every request lands on its replica with its session, and the
routing loss the store analysis finds for each request is the one the two block managers showed at its lookup when
the run was recorded (tests/fixtures/fleet-kvobs-serve/truth.json); the router what-if's `as_routed` reproduces each
replica's hits."""

from __future__ import annotations

import pytest

from instrumented_engine.whatif.fleet import FleetPlan, simulate_fleet
from kvobs.analytics.cache.routing import fleet_losses
from tests.collectors.fleet_recording import REPLICAS, truth


@pytest.fixture
def recorded_fleet(served_fleet):
    return served_fleet.store


def test_each_request_lands_on_its_replica_with_its_session(recorded_fleet):
    requests = recorded_fleet.reads.requests()
    assert set(requests["request_id"]) == set(truth()["requests"])
    assert set(requests["instance"]) == set(REPLICAS)
    assert requests["session_id"].notna().all() and requests["session_id"].nunique() == 3


def test_the_routing_loss_is_what_the_block_managers_showed(recorded_fleet):
    store = recorded_fleet
    first, last = store.reads.time_range()
    losses, check = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    assert check.notes == [] and check.block_sizes == dict.fromkeys(REPLICAS, 16)
    recorded = truth()["requests"]
    assert dict(zip(losses["request_id"], losses["own_blocks"])) == {r: v["own_blocks"] for r, v in recorded.items()}
    assert dict(zip(losses["request_id"], losses["routed_blocks"])) == {
        r: v["routed_blocks"] for r, v in recorded.items()
    }
    assert dict(zip(losses["request_id"], losses["best_instance"])) == {r: v["held_by"] for r, v in recorded.items()}
    assert sum(v["routed_blocks"] for v in recorded.values()) > 0


def test_the_as_routed_router_reproduces_each_replicas_hits(recorded_fleet):
    """Through a collector the agents' session releases arrive as removals that say so (`BlockRemoved.reason`,
    kvobs's extension on our engine's wire), so the replay releases each session where its last step ran and
    `as_routed` finds exactly the hits each replica found, as it does from the engine's own rows
    (tests/analytics/test_routing_loss.py)."""
    requests = recorded_fleet.reads.requests()
    fleet = FleetPlan.from_store(recorded_fleet)
    assert fleet.sizes == dict.fromkeys(REPLICAS, 96)
    assert set(fleet.plan.releases) == set(requests["session_id"].dropna())  # every session released at its end
    observed = simulate_fleet(fleet, "as_routed")
    expected = requests.groupby("instance")["cached_tokens"].sum().to_dict()
    assert {name: r.hit_tokens for name, r in observed.per_replica.items()} == expected
    assert {name: r.requests for name, r in observed.per_replica.items()} == requests[
        "instance"
    ].value_counts().to_dict()
