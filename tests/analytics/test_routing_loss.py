"""Routing loss on a real fleet: two `kvobs serve` replicas into one store, `kvobs agents` spreading each session's
steps over them by the routing asked for, and the expected loss of each request read from the replicas' own block
managers at the moment of its lookup (not from the store the analysis reads).

`session` keeps a session on one replica: with the cache large enough, nothing it needs is elsewhere (loss 0).
`round_robin` sends each step to the other replica than the step before: each step finds its session's prefix on
the replica it just left, and the analysis must find exactly the blocks resident there minus those found locally.
"""

from __future__ import annotations

import pandas as pd
import pytest

from instrumented_engine.whatif.fleet import POLICIES, FleetPlan, simulate_fleet
from kvobs.analytics.cache.fleet_index import FleetIndex
from kvobs.analytics.cache.routing import FleetCheck, fleet_losses, routing_losses, routing_summary
from kvobs.analytics.steps.causes import step_causes
from kvobs.store import open_store
from tests.cli.test_agents import agents
from tests.fleet_probe import LookupProbe
from tests.server.conftest import running_server


@pytest.mark.parametrize("routing", ["round_robin", "session"])
def test_routing_loss_is_what_the_other_replica_held(smollm2_source, tmp_path, routing):
    """`kvobs agents --base-url A --base-url B --routing R`: each replica records the requests it served under its
    own instance; the steps land as R says; each request's routing loss is what the probe read from the managers."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    with (
        running_server(smollm2_source, options={"store_url": url, "instance": "replica-a"}, num_blocks=256) as a,
        running_server(smollm2_source, options={"store_url": url, "instance": "replica-b"}, num_blocks=256) as b,
    ):
        probe = LookupProbe({"replica-a": a, "replica-b": b})
        done = agents(
            *["--base-url", a.url, "--base-url", b.url, "--routing", routing, "--store", url],
            *["--sessions", "2", "--steps", "3", "--concurrency", "1", "--max-tokens", "2"],
            *["--tool-pause-ms", "20", "--seed", "3", "--step-deadline-s", "60"],  # given: no measuring requests
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
    store = open_store(url)
    requests = store.reads.requests().sort_values("arrival_ts")
    steps = store.reads.steps()
    first, last = store.reads.time_range()
    losses, check = fleet_losses(store, requests, steps, first, last)
    causes = step_causes(store, first, last)

    assert len(requests) == 6 and set(requests["instance"]) == {"replica-a", "replica-b"}
    replicas = requests.groupby("session_id", sort=False)["instance"].apply(list)
    if routing == "session":
        assert all(len(set(hops)) == 1 for hops in replicas), replicas
    else:  # one session at a time: the global turn alternates inside each session too
        assert all(x != y for hops in replicas for x, y in zip(hops, hops[1:])), replicas

    assert check.notes == [] and check.block_sizes == {"replica-a": 16, "replica-b": 16}
    assert set(probe.routed) == set(requests["request_id"])
    found = dict(zip(losses["request_id"], losses["routed_blocks"]))
    assert found == probe.routed  # every request compared, each with the loss the managers showed
    assert dict(zip(losses["request_id"], losses["best_instance"])) == {
        rid: probe.held_by.get(rid) for rid in probe.routed
    }
    # the router what-if over the same run: `as_routed` replays each request where it went and finds the run's hits on
    # each replica (nothing was evicted) and the routing loss the analysis found
    fleet = FleetPlan.from_store(store)
    assert fleet.sizes == {"replica-a": 256, "replica-b": 256} and fleet.plan.skipped == 0
    replayed = {policy: simulate_fleet(fleet, policy) for policy in POLICIES}
    observed = replayed["as_routed"]
    recorded = requests.groupby("instance")["cached_tokens"].sum()
    assert {n: r.hit_tokens for n, r in observed.per_replica.items()} == {n: int(v) for n, v in recorded.items()}
    assert observed.routed_tokens == 16 * sum(found.values())
    assert replayed["prefix"].routed_tokens == 0  # it goes where the longest prefix is: never a loss
    if routing == "session":
        assert sum(found.values()) == 0
        assert not causes["causes"].str.contains("routed_away_from_prefix").any()
        store.close()
        return
    rr = replayed["round_robin"]  # one request at a time, alternating from replica-a: as the run was routed
    assert (rr.hit_tokens, rr.routed_tokens) == (observed.hit_tokens, observed.routed_tokens)
    # a session's second step finds its first step's prompt only on the replica it just left
    second = requests[requests.groupby("session_id").cumcount() == 1]["request_id"]
    assert all(found[rid] > 0 for rid in second), found
    routed_steps = causes[causes["routed_tokens"] > 0]
    assert len(routed_steps) == sum(1 for n in found.values() if n > 0)
    for row in routed_steps.itertuples():
        assert "routed_away_from_prefix" in row.causes.split(",")
        assert f"while {row.routed_from} held" in row.evidence and row.routed_from != row.instance
    summary = routing_summary(losses, first, last).set_index("instance")
    assert summary.loc["fleet", "routed_tokens"] == 16 * sum(found.values())
    assert 0 < summary.loc["fleet", "routed_share"] < 1
    store.close()


def _frames(rows: list[tuple]) -> pd.DataFrame:
    columns = ["ts", "instance", "kind", "block_hash", "parent_hash", "num_tokens", "session_id", "request_id"]
    return pd.DataFrame(rows, columns=columns)


def test_replicas_whose_hashes_cannot_meet_are_not_compared_and_say_why():
    """Two replicas of different block sizes, and two whose hash chains never meet although a session ran on both
    (different hash seeds): each pair is left out with a sentence, and no loss is claimed between them."""
    requests = pd.DataFrame(
        {
            "request_id": ["r1", "r2", "r3", "r4"],
            "instance": ["a", "b", "c", "a"],
            "session_id": ["s", "s", "s", "s"],
            "arrival_ts": [1.0, 2.0, 3.0, 4.0],
            "finished_ts": [1.5, 2.5, 3.5, 4.5],
            "queue_s": [0.0] * 4,
            "prompt_tokens": [40, 40, 40, 40],
            "cached_tokens": [0, 0, 0, 0],
        }
    )
    events = _frames(
        [
            (1.1, "a", "stored", 11, None, 16, "s", "r1"),
            (1.1, "a", "stored", 12, 11, 16, "s", "r1"),
            (2.1, "b", "stored", 21, None, 16, "s", "r2"),  # the same tokens, another seed
            (2.1, "b", "stored", 22, 21, 16, "s", "r2"),
            (3.1, "c", "stored", 31, None, 32, "s", "r3"),
        ]
    )
    check = FleetCheck.of(events, requests)
    assert check.block_sizes == {"a": 16, "b": 16, "c": 32}
    assert not check.comparable("a", "b") and not check.comparable("a", "c") and not check.comparable("b", "c")
    assert any("differ in block size (a 16, b 16, c 32 tokens)" in note for note in check.notes)
    assert any(note.startswith("a and b never stored the same block although 1 session(s)") for note in check.notes)
    assert routing_losses(requests, events, check).empty


def test_a_block_on_another_tier_or_in_another_group_of_a_replica_is_still_held_there():
    """Replica `b` holds the session's 3-block prefix; then its offload tier (CPU) takes copies and its device copies
    of blocks 1 and 2 go, and a hybrid model's sliding-window group (group 1) drops its own copies of all three:
    `b` still holds the whole prefix (loaded from its CPU tier, kept in its full-attention group), so a request of
    the session on `a`, which found nothing, recomputed 3 blocks `b` held. A reset of `b` drops every tier."""
    requests = pd.DataFrame(
        {
            "request_id": ["r1", "r2", "r3"],
            "instance": ["b", "a", "a"],
            "session_id": ["s", "s", "s"],
            "arrival_ts": [1.0, 5.0, 8.0],
            "finished_ts": [1.5, 5.5, 8.5],
            "queue_s": [0.0] * 3,
            "prompt_tokens": [50, 50, 50],
            "cached_tokens": [0, 0, 0],
        }
    )
    chain = [(1, None), (2, 1), (3, 2)]
    rows = [(1.1, "b", "stored", h, p, 16, "s", "r1", "GPU", 0) for h, p in chain]
    rows += [(1.2, "b", "stored", h, p, 16, "s", "r1", "GPU", 1) for h, p in chain]  # the window group's copies
    rows += [(2.0, "b", "stored", h, p, 16, None, None, "CPU", 0) for h, p in chain]  # offloaded
    rows += [(3.0, "b", "removed", h, None, 16, "s", None, "GPU", 0) for h in (1, 2)]  # the device copies go
    rows += [(3.5, "b", "removed", h, None, 16, "s", None, "GPU", 1) for h, _ in chain]  # the window drops all
    rows += [(5.1, "a", "stored", h, p, 16, "s", "r2", "GPU", 0) for h, p in chain]
    rows += [(6.0, "b", "cleared", None, None, None, None, None, None, None), (6.0, "a", "cleared", *[None] * 7)]
    columns = [*_frames([]).columns, "medium", "group_idx"]
    events = pd.DataFrame(rows, columns=columns)
    losses = routing_losses(requests, events).set_index("request_id")
    assert losses.loc["r2", "routed_blocks"] == 3 and losses.loc["r2", "best_instance"] == "b"
    assert losses.loc["r3", "routed_blocks"] == 0  # after the reset nothing is held anywhere
    index = FleetIndex()
    index.apply(*(events[c] for c in ("kind", "instance", "block_hash", "parent_hash", "ts", "medium")))
    assert not index.resident.get("b") and not index.parent  # the reset dropped the CPU copies too
    bare = FleetIndex()  # a removal naming no tier removes the copy where it is
    bare.apply(["stored", "removed"], ["x", "x"], [7, 7], [None, None], [1.0, 2.0], ["GPU", None])
    assert bare.resident["x"] == {}


def test_a_hit_held_only_below_the_cache_is_a_load_and_a_block_not_held_is_none():
    """Block 2 left the cache after its copy reached the CPU tier: a lookup that finds it loads it; block 1 is in
    the cache; block 3 is held nowhere; a replica with no tier below its cache loads nothing."""
    index = FleetIndex()
    index.apply(
        ["stored", "stored", "tier_stored", "removed", "stored"],
        ["a", "a", "a", "a", "b"],
        [1, 2, 2, 2, 1],
        [None, 1, None, None, None],
        None,
        [None, None, "CPU", None, None],
    )
    assert index.prefix_on("a", [1, 2, 3]) == 2  # a holds both: one in its cache, one below it
    assert index.held_below_only("a", [1, 2, 3]) == 1
    assert index.held_below_only("b", [1, 2]) == 0
