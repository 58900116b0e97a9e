"""What-if replay through the engine's own block manager, on the recorded runs."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from instrumented_engine.whatif.fleet import POLICIES, FleetPlan, simulate_fleet
from instrumented_engine.whatif.replay import ReplayPlan, simulate
from instrumented_engine.whatif.units import ReplayRequest
from kvobs.semconv.reasons import RELEASE_REASONS
from tests.runs import NUM_BLOCKS


def test_replay_at_the_observed_size_and_policy_reproduces_the_engine_run(agent_run):
    """Our engine's recorded traffic replayed step for step through the same block manager: the same hits, the same
    blocks lost for the same reasons, the same tool-pause losses, the same recompute."""
    store = agent_run.store
    plan = ReplayPlan.from_store(store)
    assert plan.block_size == 16 and len(plan.requests) == 18 and plan.skipped == 0 and plan.recorded is not None
    assert plan.observed["num_blocks"] == NUM_BLOCKS
    same = simulate(plan, num_blocks=NUM_BLOCKS)
    observed = store.reads.block_losses(bucket_s=1e12).groupby("reason")["blocks"].sum().to_dict()
    lost = {reason: n for reason, n in same.by_reason.items() if reason not in RELEASE_REASONS}
    assert lost == observed and same.evicted_blocks == plan.observed["evicted_blocks"]
    assert same.released_blocks == plan.observed["released_blocks"] > 0  # the agents' releases: apart, not lost
    assert observed.get("capacity", 0) > 0  # the run really evicted
    assert same.hit_rate == pytest.approx(plan.observed["hit_rate"])
    assert same.lost_in_pause_blocks == plan.observed["lost_in_pause_blocks"] > 0
    assert same.recompute_tokens == plan.observed["recompute_tokens"]


def test_more_blocks_never_hit_less_and_enough_blocks_evict_nothing(agent_run):
    plan = ReplayPlan.from_store(agent_run.store)
    results = [simulate(plan, num_blocks=n) for n in (NUM_BLOCKS, 60, 120, 2000)]
    rates = [r.hit_rate for r in results]
    assert rates == sorted(rates) and rates[-1] > rates[0]
    unlimited = results[-1]
    # nothing is evicted for room; sessions' releases still drop the blocks only they held, as recorded, and a later
    # session with the same prompt recomputes those
    assert unlimited.by_reason.get("capacity", 0) == 0 and unlimited.waited == 0 and unlimited.preemptions == 0
    assert unlimited.recompute_tokens <= unlimited.by_reason.get("session_release", 0) * plan.block_size
    # with room for everything the replay hits what the chains say was available, but for the released blocks a later
    # request recomputed (a never-evicting cache has no releases either)
    from kvobs.analytics.cache.chains import BlockGraph, hit_rates, request_chains

    reqs, stored = agent_run.store.reads.requests(), agent_run.store.reads.stored_blocks()
    graph = BlockGraph.from_stored(stored)
    available = hit_rates(reqs, request_chains(reqs, stored, graph), graph, block_size=16)["available_tokens"].sum()
    assert unlimited.hit_tokens + unlimited.recompute_tokens >= available > 0


def test_session_ttl_protects_paused_sessions(agent_run):
    plan = ReplayPlan.from_store(agent_run.store)
    lru = simulate(plan, num_blocks=60, policy="lru")
    ttl = simulate(plan, num_blocks=60, policy="session_ttl", ttl_s=60)
    assert ttl.lost_in_pause_blocks <= lru.lost_in_pause_blocks


def _request(rid: str, session: str, start: float, chain: range, tokens: int) -> ReplayRequest:
    return ReplayRequest(rid, session, start, start + 1.0, tokens, tokens, tuple(chain))


def test_session_ttl_longer_than_every_pause_loses_nothing_in_a_pause_when_the_cache_holds_the_pausing_sessions():
    """Scripted: sessions a and b pause between two requests; one-shot sessions t1, t2 pass through in the meantime.
    12 usable blocks hold both pausing sessions (4 blocks each) and one one-shot session. LRU takes the paused
    sessions' blocks (they are the oldest); session_ttl with a TTL longer than the pauses takes the one-shot
    sessions' (they have ended), so nothing is lost in a pause. TTL 0 protects nothing: it is LRU."""
    plan = ReplayPlan(
        [
            _request("a1", "a", 0.0, range(100, 104), 16),
            _request("b1", "b", 2.0, range(200, 204), 16),
            _request("t1", "t1", 4.0, range(300, 304), 16),
            _request("t2", "t2", 6.0, range(400, 404), 16),
            _request("a2", "a", 8.0, range(100, 105), 20),
            _request("b2", "b", 10.0, range(200, 205), 20),
        ],
        block_size=4,
    )
    lru = simulate(plan, num_blocks=13, policy="lru")
    ttl = simulate(plan, num_blocks=13, policy="session_ttl", ttl_s=100.0)
    zero = simulate(plan, num_blocks=13, policy="session_ttl", ttl_s=0.0)
    assert lru.lost_in_pause_blocks > 0 and lru.hit_rate < ttl.hit_rate
    assert ttl.lost_in_pause_blocks == 0 and ttl.evicted_blocks > 0  # it evicted, but only ended sessions' blocks
    assert ttl.hit_tokens == 2 * 16  # a2 and b2 found their 4 blocks
    assert (zero.evicted_blocks, zero.lost_in_pause_blocks, zero.hit_tokens) == (
        lru.evicted_blocks,
        lru.lost_in_pause_blocks,
        lru.hit_tokens,
    )


def test_vllm_replay_and_cli(vllm_run):
    plan = ReplayPlan.from_store(vllm_run.store)
    assert plan.block_size == 128 and len(plan.requests) >= 40
    small, large = simulate(plan, num_blocks=33), simulate(plan, num_blocks=400)
    assert large.hit_rate >= small.hit_rate and large.evicted_blocks == 0
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvobs.cli",
            "whatif",
            "--store",
            vllm_run.url,
            "--num-blocks",
            "33,400",
            "--policy",
            "session_ttl",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "| observed | 32 |" in done.stdout and "| session_ttl 30 s | 400 |" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "whatif", "--store", vllm_run.url, "--num-blocks", "1,x"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "block counts" in bad.stderr


def test_whatif_and_analytics_import_without_torch():
    """The block manager holds no tensors: replay (and kvobs' analytics and alerts) must not pull torch in."""
    code = (
        "import sys, instrumented_engine.whatif.replay, kvobs.analytics.cache.chains, kvobs.alerts.evaluator; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_router_whatif_on_the_recorded_fleet_and_its_errors(fleet_run, vllm_run):
    """`kvobs whatif --replicas`: every router through the same replay, one row each; one replica, or neither
    --num-blocks nor --replicas, is a one-line error and exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "whatif", "--store", fleet_run.url, "--replicas"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| router")]
    assert [row.split("|")[1].strip() for row in rows] == list(POLICIES)
    assert "over 2 replicas (blocks: vllm-a 32, vllm-b 32), block size 128" in done.stdout
    for store, flags, message in (
        (vllm_run, ["--replicas"], "needs requests of two replicas or more"),
        (
            fleet_run,
            [],
            "give --num-blocks N[,N...] (cache sizes), --tier-blocks N[,N...] (an offload tier) or --replicas",
        ),
    ):
        bad = subprocess.run(
            [sys.executable, "-m", "kvobs.cli", "whatif", "--store", store.url, *flags], capture_output=True, text=True
        )
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr


def test_the_routers_replay_the_recorded_fleet_each_request_once(fleet_run):
    fleet = FleetPlan.from_store(fleet_run.store)
    results = {policy: simulate_fleet(fleet, policy) for policy in POLICIES}
    counts = {len(fleet.plan.requests)} | {
        r.requests + sum(x.too_large for x in r.per_replica.values()) for r in results.values()
    }
    assert len(counts) == 1  # every request replayed once under every router
    observed = results["as_routed"]
    recorded = pd.Series(fleet.instance_of).value_counts()
    assert all(observed.per_replica[n].requests <= recorded[n] for n in fleet.sizes)
    assert results["prefix"].routed_tokens == 0
    assert results["round_robin"].imbalance("requests") <= 1.05


def test_a_request_recorded_under_two_instance_names_counts_once_in_the_observed_row(agent_run, tmp_path):
    """Our engine writes its own request rows; a collector taking the same engine's spans into the same store writes
    them again under the exporter's name. With runs recorded each replays its own instance; in a store without them
    (one from before runs were recorded) the range is one replay: the observed row and the replay count each request
    once, so at the observed size and policy the observed row is still the run, and the table says so."""
    import sqlite3

    from sqlalchemy.engine import make_url

    from instrumented_engine.commands.whatif import format_table
    from instrumented_engine.whatif.runs import observed_total, replay_plans, simulate_runs
    from kvobs.store import open_store

    path = tmp_path / "twice.db"
    with sqlite3.connect(make_url(agent_run.url).database) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
        columns = [c[1] for c in copy.execute("PRAGMA table_info(requests)") if c[1] not in ("id", "instance")]
        listed = ", ".join(columns)
        copy.execute(f"INSERT INTO requests (instance, {listed}) SELECT 'kvobs-engine', {listed} FROM requests")
        copy.execute("DELETE FROM runs")
    store = open_store(f"sqlite:///{path}")
    num_requests = len(agent_run.store.reads.requests())
    assert len(store.reads.requests()) == 2 * num_requests  # every request twice, under two names
    plans = replay_plans(store)
    assert sum(p.duplicates for p in plans) == num_requests
    observed = observed_total(plans, store, None, None)
    total, _ = simulate_runs(plans, num_blocks=NUM_BLOCKS, policy="lru")
    assert observed["recompute_tokens"] == total.recompute_tokens > 0  # counted the same way, once each
    assert f"{num_requests:,} requests were recorded under two instance names" in format_table(
        plans, observed, [(total, [])]
    )
    store.close()
