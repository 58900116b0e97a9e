"""The what-if reproduces before it predicts: at each recorded run's observed size and policy the replay is checked
against the run's hit rate, and where it misses by more than 2 points the check says so and names the cause the
data shows. The truths: our engine's runs (replayed step for step), two real vLLM replicas whose responses said
each request's cached tokens, two `kvobs serve` replicas through a collector, and the recorded vLLM run played as a
fleet (whose replicas' events and requests do not agree, by construction)."""

from __future__ import annotations

import pytest

from collectors.capture import import_capture
from instrumented_engine.whatif.engine_rules import AT_ALLOCATION, WHEN_COMPUTED
from instrumented_engine.whatif.fidelity import WITHIN_POINTS, fidelity, fleet_fidelity, on_answered, run_fidelity
from instrumented_engine.whatif.fleet import FleetPlan, simulate_fleet
from instrumented_engine.whatif.replay import simulate
from instrumented_engine.whatif.runs import observed_total, replay_plans
from kvobs.semconv.reasons import RouterPolicy
from kvobs.semconv.spans import RunEngine
from kvobs.store import open_store
from tests.collectors.agent_harness import FIXTURES
from tests.collectors.fleet_recording import cached_said
from tests.whatif.helpers import altered_copy, whatif


def checks(store):
    plans = replay_plans(store)
    total, per_run = fidelity(plans, observed_total(plans, store, None, None)["hit"])
    return plans, total, {plan.span.instance: check for plan, check in zip(plans, per_run)}


def test_our_engines_run_is_reproduced_exactly(agent_run):
    assert set(agent_run.store.reads.runs()["engine"]) == {RunEngine.KVOBS.value}  # (its own record of its run)
    _, total, per_run = checks(agent_run.store)
    assert total.error_points == pytest.approx(0.0, abs=1e-9) and total.reproduces
    assert "reproduces the run before it predicts" in total.describe()
    assert not total.policy_assumed  # our engine records its policy
    assert total.pauses_comparable  # replayed step for step: its pause losses count what the engine counted


def test_the_recorded_vllm_run_is_checked_against_vllms_own_responses(vllm_run):
    """vLLM publishes no allocations, so its run is replayed whole-length: each request takes its prompt's blocks at
    its lookup and a decode block each time its output fills one (between its recorded first token and finish); at
    its 32 blocks of 128 tokens the check compares the replay with what vLLM's responses said for the same requests
    (50 of the 51 replayed: the request after the reset was sent by no step; 6 first requests whose whole prompt
    another session had stored have no chain of their own, and are not replayed). The replay is 0.7 points under the
    run, within the 2 points that make its other sizes evidence. Holding each request's whole length from its
    lookup instead, as the replay did before, put it 4.9 points under: its decode blocks, taken before their time,
    pushed out prefixes vLLM kept."""
    plans, total, per_run = checks(vllm_run.store)
    check = per_run["vllm-cpu"]
    assert check.observed_source == "responses" and check.answered == (50, 51) and plans[0].skipped == 6
    assert check.num_blocks == 32 and check.policy == "lru" and check.policy_assumed
    assert check.error_points == pytest.approx(-0.7, abs=0.05) and check.reproduces
    assert "reproduces the run before it predicts" in check.describe()
    assert "assumed: the run recorded none" in check.describe()
    whole = simulate(plans[0], num_blocks=32, policy="lru", decode_growth=False)  # the replay before
    whole = on_answered(whole, plans[0].observed["answered"])
    assert 100 * (whole.hit_rate - check.observed) == pytest.approx(-4.9, abs=0.05)
    # vLLM names only the session that stored a block: the observed pause losses are of another definition
    assert not check.pauses_comparable and not total.pauses_comparable


def test_each_engine_is_replayed_by_its_own_rule_for_when_a_prompt_is_found(vllm_run, tmp_path):
    """vLLM v1 caches a block as it allocates it, so a request admitted in the same step finds its neighbour's new
    prefix; kvobs serve registers a block once its KV is written. The OpenAI Agents SDK's capture (kvobs serve, 34
    blocks, no /metrics scraped: its store says no engine) has two conversations start at the same moment on one
    system prompt: the engine gave the second none of the first's 80 tokens. Replayed by vLLM's rule, as a run that
    says no engine is, the replay finds them: 3.05 points over, and the check says the rule was assumed; by kvobs
    serve's, it reproduces to the token. The vLLM 0.32 run the other way round: by kvobs serve's rule, 5.2 under."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    import_capture(store, FIXTURES / "openai-agents-kv-ownership")
    (plan,) = replay_plans(store)
    plan.observed["num_blocks"] = 34  # (its recorder's --num-blocks: no scrape says it)
    assumed = run_fidelity(plan)
    assert assumed.registers == AT_ALLOCATION and assumed.engine_assumed
    assert assumed.error_points == pytest.approx(3.05, abs=0.01) and not assumed.reproduces
    assert "from its lookup on, as vLLM caches a block it allocates, assumed: the run said no engine" in (
        assumed.describe()
    )
    plan.engine = RunEngine.KVOBS.value
    ours = run_fidelity(plan)
    assert ours.registers == WHEN_COMPUTED and not ours.engine_assumed
    assert ours.error_points == pytest.approx(0.0, abs=1e-9) and "from its first token on" in ours.describe()
    (vllm,) = replay_plans(vllm_run.store)
    assert vllm.engine == RunEngine.VLLM.value  # (its /metrics: vLLM's cache config without our start time)
    computed = on_answered(simulate(vllm, num_blocks=32, registers=WHEN_COMPUTED), vllm.observed["answered"])
    assert 100 * (computed.hit_rate - vllm.observed["hit"].rate) == pytest.approx(-5.2, abs=0.05)


def test_a_vllm_run_the_replay_was_not_built_on_is_reproduced_on_the_requests_that_said_their_hits(tmp_path):
    """Six sessions on one system prompt and another tenant's long prompts on a real vLLM of 16 blocks
    (`vllm-six-sessions-kv`, recorded after the replay's rules were set): the 18 agent requests' counts come from
    their steps' replies, the tenant's 7 say none. The observed rate is over the 18 and so is the replay's, which
    replays all 25 (the tenant's calls take room too): it reproduces to the token. By kvobs serve's rule for when a
    prompt is found, the six requests admitted together miss their shared prompt: 6.9 points under."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    import_capture(store, FIXTURES / "vllm-six-sessions-kv")
    (plan,) = replay_plans(store)
    plan.observed["num_blocks"], plan.engine = 16, RunEngine.VLLM.value  # (its recorder's: no scrape says them)
    check = run_fidelity(plan)
    assert check.observed_source == "requests" and check.answered == (18, 25)
    assert check.error_points == pytest.approx(0.0, abs=1e-9) and check.reproduces
    assert "as 18 of the 25 replayed requests' own records said; the replay's over those" in check.describe()
    computed = on_answered(simulate(plan, num_blocks=16, registers=WHEN_COMPUTED), plan.observed["answered"])
    assert 100 * (computed.hit_rate - check.observed) == pytest.approx(-6.89, abs=0.01)


def test_two_real_vllm_replicas_are_compared_on_the_counts_their_responses_gave(vllm_fleet):
    """Each request's response said its cached tokens (its SDK step's call span: the collector filled the request's
    count from it, `cached_from` reply): the check compares the replay with exactly those requests, and both
    replicas reproduce to the token. Replica b served its first request before the
    recorder's first scrape, so its counters (kept as `counted`) are of other requests: 2,048 of 3,532 there,
    against 2,048 of the 3,723 its requests hold."""
    store = vllm_fleet.store
    plans, total, per_run = checks(store)
    said, requests = cached_said(store), store.reads.requests()
    for plan in plans:
        check = per_run[plan.span.instance]
        mine = requests.loc[requests["instance"] == plan.span.instance, "request_id"]
        assert check.replay.hit_tokens == sum(said[r] for r in mine) > 0
        assert set(requests.loc[mine.index, "cached_from"]) == {"reply"}
        assert requests.loc[mine.index, "cached_tokens"].tolist() == [said[r] for r in mine]
        assert check.observed_source == "requests" and check.answered is None  # (every request: none left out)
        assert check.error_points == pytest.approx(0.0, abs=1e-9) and check.reproduces
        assert "(as its requests said)" in check.describe()
    counted = next(p for p in plans if p.span.instance == "replica-b").observed["counted"]
    assert (counted.source, counted.hit_tokens, counted.query_tokens) == ("counters", 2048, 3532)
    assert total.reproduces and total.observed_source == "requests"
    fleet = FleetPlan.from_store(store)
    routed = fleet_fidelity(fleet, simulate_fleet(fleet, RouterPolicy.AS_ROUTED.value))
    assert routed.error_points == pytest.approx(0.0, abs=1e-9) and routed.observed_source == "requests"


def test_without_the_responses_usage_the_counters_are_compared_and_their_gap_named(vllm_fleet, tmp_path):
    """The same recording with no step saying its cached tokens: replica b is compared with its counters, 3 points
    off, and the check names the counters' gap instead of calling the replay wrong."""
    store = altered_copy(
        vllm_fleet,
        tmp_path,
        "UPDATE steps SET cached_tokens = NULL",
        "UPDATE requests SET cached_tokens = NULL, cached_from = NULL WHERE cached_from = 'reply'",
    )
    _, _, per_run = checks(store)
    assert per_run["replica-a"].observed_source == "counters" and per_run["replica-a"].reproduces
    b = per_run["replica-b"]
    assert b.observed_source == "counters" and b.answered is None
    assert b.error_points == pytest.approx(100 * (2048 / 3723 - 2048 / 3532))
    assert not b.reproduces and len(b.reasons) == 1 and "scraped over part of the run" in b.reasons[0]
    assert "3,723 the run's requests hold" in b.reasons[0]
    assert "as the engine's counters counted" in b.describe()


def test_kvobs_serve_replicas_through_a_collector_are_reproduced_exactly(served_fleet):
    """Each replica's run replays to its own hit rate, sessions released by the agents included (their blocks go when
    the release says, as on the engine); once the replay ignored them and replica b came out 13 points high."""
    plans, total, per_run = checks(served_fleet.store)
    assert {plan.span.instance: len(plan.releases) for plan in plans} == {"replica-a": 0, "replica-b": 3}
    for check in per_run.values():
        assert check.error_points == pytest.approx(0.0, abs=1e-9)
    fleet = FleetPlan.from_store(served_fleet.store)
    routed = fleet_fidelity(fleet, simulate_fleet(fleet, RouterPolicy.AS_ROUTED.value))
    assert routed.error_points == pytest.approx(0.0, abs=1e-9)


def test_a_replica_whose_cache_served_traffic_kvobs_never_saw_is_no_evidence(fleet_run):
    """The fixture deals the recorded requests out between two replicas while vllm-a's events and counters are the
    whole run's: its cache served requests kvobs holds under vllm-b. The replay cannot reproduce that run, and the
    check says so and why, for each run and for the routers."""
    _, total, per_run = checks(fleet_run.store)
    a, b = per_run["vllm-a"], per_run["vllm-b"]
    assert not a.reproduces and a.error_points > WITHIN_POINTS
    assert any("never reached kvobs" in reason for reason in a.reasons)
    # vllm-b's stream and requests are its own half's: it is judged on its own requests' responses
    assert b.observed_source == "responses" and b.answered is not None
    assert not total.reproduces and "the other sizes are no evidence" in total.describe()
    assert "vllm-a" in [span.instance for span, _ in total.runs_off]
    fleet = FleetPlan.from_store(fleet_run.store)
    routed = fleet_fidelity(fleet, simulate_fleet(fleet, RouterPolicy.AS_ROUTED.value))
    assert not routed.reproduces and "the other routers are no evidence" in routed.describe()


def test_the_cli_prints_the_check_after_each_table(fleet_run):
    sizes = whatif(fleet_run.url, "--num-blocks", "32")
    assert sizes.count("At the observed configuration (32 blocks; policy lru") == 3  # the total, each run
    assert "never reached kvobs" in sizes
    routers = whatif(fleet_run.url, "--replicas", "--router", "as_routed")
    # the observed rate the check compares: the replayed requests' responses (the request after the reset, which no
    # step sent, and the failed step's, which never reached vLLM, said none)
    assert "| as_routed |" in routers and "observed: hit rate 42.8% (the fleet's, as the replayed" in routers
    assert "the other routers are no evidence" in routers


def test_runs_of_different_sizes_are_said_so_never_as_none_blocks():
    """Runs added up at their own sizes have no one size: the check says so, with no "None" in its text."""
    from instrumented_engine.whatif.fidelity import Fidelity
    from instrumented_engine.whatif.units import WhatIfResult

    replay = WhatIfResult(0, "", query_tokens=1000, hit_tokens=300)
    said = Fidelity(None, "lru", 0.31, replay).describe()
    assert "each run at its own size; policy lru" in said and "None" not in said
    assert "(48 blocks; policy lru)" in Fidelity(48, "lru", 0.31, replay).describe()
