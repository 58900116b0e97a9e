"""What-if replay through the engine's own block manager, on the recorded runs."""

from __future__ import annotations

import subprocess
import sys

from instrumented_engine.whatif import ReplayPlan, ReplayRequest, simulate
from tests.runs import NUM_BLOCKS


def test_replay_at_the_observed_size_predicts_the_observed_hit_rate(agent_run):
    plan = ReplayPlan.from_store(agent_run.store)
    assert plan.block_size == 16 and len(plan.requests) == 18 and plan.skipped == 0
    assert plan.observed["num_blocks"] == NUM_BLOCKS
    same = simulate(plan, num_blocks=NUM_BLOCKS)
    assert (
        abs(same.hit_rate - plan.observed["hit_rate"]) < 0.1
    )  # the replay holds blocks a little longer than the engine
    assert same.evicted_blocks > 0 and same.lost_in_pause_blocks > 0


def test_more_blocks_never_hit_less_and_enough_blocks_evict_nothing(agent_run):
    plan = ReplayPlan.from_store(agent_run.store)
    results = [simulate(plan, num_blocks=n) for n in (NUM_BLOCKS, 60, 120, 2000)]
    rates = [r.hit_rate for r in results]
    assert rates == sorted(rates) and rates[-1] > rates[0]
    unlimited = results[-1]
    assert unlimited.evicted_blocks == 0 and unlimited.recompute_tokens == 0 and unlimited.waited == 0
    # with room for everything the replay hits at least what the chains say was available (it registers a request's
    # blocks at its lookup, so an overlapping request can hit them a little earlier than the engine allowed)
    from kvobs.analytics.chains import BlockGraph, hit_rates, request_chains
    from kvobs.store import queries

    reqs, stored = queries.requests(agent_run.store), queries.stored_blocks(agent_run.store)
    graph = BlockGraph.from_stored(stored)
    available = hit_rates(reqs, request_chains(reqs, stored, graph), graph, block_size=16)["available_tokens"].sum()
    assert unlimited.hit_tokens >= available > 0


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
    plan = ReplayPlan([
        _request("a1", "a", 0.0, range(100, 104), 16), _request("b1", "b", 2.0, range(200, 204), 16),
        _request("t1", "t1", 4.0, range(300, 304), 16), _request("t2", "t2", 6.0, range(400, 404), 16),
        _request("a2", "a", 8.0, range(100, 105), 20), _request("b2", "b", 10.0, range(200, 205), 20),
    ], block_size=4)  # fmt: skip
    lru = simulate(plan, num_blocks=13, policy="lru")
    ttl = simulate(plan, num_blocks=13, policy="session_ttl", ttl_s=100.0)
    zero = simulate(plan, num_blocks=13, policy="session_ttl", ttl_s=0.0)
    assert lru.lost_in_pause_blocks > 0 and lru.hit_rate < ttl.hit_rate
    assert ttl.lost_in_pause_blocks == 0 and ttl.evicted_blocks > 0  # it evicted, but only ended sessions' blocks
    assert ttl.hit_tokens == 2 * 16  # a2 and b2 found their 4 blocks
    assert (zero.evicted_blocks, zero.lost_in_pause_blocks, zero.hit_tokens) == (
        lru.evicted_blocks, lru.lost_in_pause_blocks, lru.hit_tokens)  # fmt: skip


def test_vllm_replay_and_cli(vllm_run):
    plan = ReplayPlan.from_store(vllm_run.store)
    assert plan.block_size == 128 and len(plan.requests) >= 40
    small, large = simulate(plan, num_blocks=33), simulate(plan, num_blocks=400)
    assert large.hit_rate >= small.hit_rate and large.evicted_blocks == 0
    done = subprocess.run([sys.executable, "-m", "kvobs.cli", "whatif", "--store", vllm_run.url, "--num-blocks",
                           "33,400", "--policy", "session_ttl"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "| observed | 32 |" in done.stdout and "| session_ttl | 400 |" in done.stdout
    bad = subprocess.run([sys.executable, "-m", "kvobs.cli", "whatif", "--store", vllm_run.url, "--num-blocks", "1,x"],
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "block counts" in bad.stderr


def test_whatif_and_analytics_import_without_torch():
    """The block manager holds no tensors: replay (and kvobs' analytics and alerts) must not pull torch in."""
    code = ("import sys, instrumented_engine.whatif, kvobs.analytics.chains, kvobs.alerts.evaluator; "
            "assert 'torch' not in sys.modules, 'torch was imported'")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
