"""The what-if with an offload tier, against our engine's own tier: `kvobs serve` with a 12-block cache and a 64-block
CPU tier, sessions a and b evicted from the cache by fillers while they wait and loaded back from the tier. Replayed
at the run's size with its tier (recorded in `runs.offload_blocks`), the replay loads what the engine loaded, hits
what it hit, and counts the pause losses the tier gave back; without the tier those tokens are recomputed."""

from __future__ import annotations

import pytest

from instrumented_engine.whatif.fidelity import fidelity
from instrumented_engine.whatif.replay import simulate
from instrumented_engine.whatif.runs import observed_total, replay_plans
from instrumented_engine.whatif.time_saved import Prices, request_costs, time_saved
from kvobs.store import open_store
from tests.server.conftest import ask_session, filler_prompt, running_server
from tests.whatif.helpers import altered_copy, whatif

BLOCK_BYTES = 737_280  # SmolLM2's float32 KV for a 16-token block
TIER_BLOCKS = 64


@pytest.fixture(scope="module")
def tier_run(smollm2_source, tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('tier-run') / 'kvobs.db'}"
    question = "plan a day in Rome with museums, lunch and a walk by the river."
    prompts = [
        ("a", f"Session a: {question}"),
        ("b", f"Session b: {question} And a dinner."),
        *((f"z{k}", filler_prompt(k)) for k in range(4)),
        ("a", f"Session a: {question}"),
        ("b", f"Session b: {question} And a dinner."),
    ]
    options = {"store_url": url, "instance": "eng"}
    tier = TIER_BLOCKS * BLOCK_BYTES
    with running_server(
        smollm2_source, num_blocks=12, max_model_len=160, kv_offloading_size=tier, dtype="float32", options=options
    ) as server:
        cached = [ask_session(server, session, text) for session, text in prompts]
    return open_store(url), cached


def test_the_replay_with_the_runs_tier_loads_and_hits_what_the_engine_did(tier_run):
    store, cached = tier_run
    (plan,) = replay_plans(store)
    assert plan.tier_blocks == TIER_BLOCKS and plan.observed["num_blocks"] == 12 and plan.recorded is not None
    loaded = store.reads.kv_events(kinds=["tier_loaded"])
    assert set(loaded["session_id"]) == {"a", "b"}  # the engine's record: their blocks, loaded back
    same = simulate(plan, num_blocks=12, tier_blocks=TIER_BLOCKS)
    assert same.tier_hit_tokens == 16 * len(loaded) > 0 and sum(same.request_loads.values()) == same.tier_hit_tokens
    assert same.hit_tokens == sum(cached)  # the replies' cached tokens: the cache's hits and the tier's loads
    assert same.hit_rate == pytest.approx(plan.observed["hit_rate"])
    # their blocks were evicted while they waited: lost in the pause, as the engine counted, and all given back
    assert same.lost_in_pause_blocks == plan.observed["lost_in_pause_blocks"] > 0
    assert same.saved_in_pause_blocks == len(loaded)
    check, _ = fidelity([plan], observed_total([plan], store, None, None)["hit"])
    assert check.error_points == pytest.approx(0.0) and "over an offload tier of 64 blocks" in check.describe()


def test_without_the_tier_the_loaded_tokens_are_recomputed_and_a_small_tier_saves_less(tier_run):
    store, _ = tier_run
    (plan,) = replay_plans(store)
    same = simulate(plan, num_blocks=12, tier_blocks=TIER_BLOCKS)
    none = simulate(plan, num_blocks=12)
    assert none.tier_hit_tokens == 0 and none.saved_in_pause_blocks == 0
    assert none.hit_tokens == same.hit_tokens - same.tier_hit_tokens
    assert none.recompute_tokens == same.recompute_tokens + same.tier_hit_tokens
    # priced against the run: without the tier its loaded steps compute those tokens, and no load rate was scraped
    # into this store (no collector ran), so what loading them cost is unknown: those steps are not priced, the
    # others are (they hit the same as in the run)
    prices = Prices.from_store(store, [plan])
    priced = time_saved(none, request_costs([same]), prices)
    assert priced.unpriced == len(same.request_loads) > 0
    assert set(priced.by_request) == set(same.request_hits) - set(same.request_loads)
    sizes = [simulate(plan, num_blocks=12, tier_blocks=n) for n in (8, 16, 32, TIER_BLOCKS)]
    saved = [r.saved_in_pause_blocks for r in sizes]
    assert saved == sorted(saved) and saved[-1] == same.saved_in_pause_blocks  # a bigger tier never saves less


def test_cpu_tier_or_more_cache_on_the_recorded_vllm_run(vllm_run):
    """From the run's own setup (32 blocks, no tier: vLLM said kv_offloading_size None), blocks added to a tier give
    back pause losses and recompute, more with more blocks, and a tier as big as the whole traffic gives back every
    pause loss; the CLI prints the same table."""
    from instrumented_engine.whatif.tier_sweep import tier_sweep

    store = vllm_run.store
    (plan,) = replay_plans(store)
    assert plan.tier_blocks == 0
    rows, left_out = tier_sweep([plan], store, (32, 64, 128))
    assert left_out == []
    none = rows[0]
    assert none["added"] == "none" and none["given back by the tier"] == 0
    assert none["lost in tool pauses"] == simulate(plan, num_blocks=32).lost_in_pause_blocks > 0
    tiers = [row for row in rows if row["added"] == "offload tier"]
    given = [row["given back by the tier"] for row in tiers]
    assert given == sorted(given) and given[-1] == none["lost in tool pauses"] and tiers[-1]["lost in tool pauses"] == 0
    for row in tiers:  # what the tier gives back is what is no longer lost
        assert row["lost in tool pauses"] + row["given back by the tier"] == none["lost in tool pauses"]
        assert row["recomputed tokens"] + row["loaded from tier (tokens)"] == none["recomputed tokens"]
    assert none["recompute (s)"] > 0  # at vLLM's measured prefill rate (its scraped prefill counters)
    printed = whatif(vllm_run.url, "--tier-blocks", "32,64,128")
    last = tiers[-1]
    assert f"| offload tier | 128 | {last['hit rate']:.1%} | {last['loaded from tier (tokens)']:,} | 0 |" in printed


def test_a_run_whose_tier_size_is_not_recorded_is_neither_checked_nor_swept(tier_run, tmp_path):
    """The same run as a collector sees a vLLM tier: its tier events say there was one, its size is not said. The
    replay without it would not be that run: the check declines and says why, and the sweep leaves it out."""
    from instrumented_engine.whatif.tier_sweep import tier_sweep

    store, _ = tier_run
    unsaid = altered_copy(store, tmp_path, "UPDATE runs SET offload_blocks = NULL")
    plans = replay_plans(unsaid)
    assert plans[0].tier_blocks is None and plans[0].observed["tier_events"] > 0
    check, (run_check,) = fidelity(plans, observed_total(plans, unsaid, None, None)["hit"])
    assert check.reproduces is None and run_check.reproduces is None
    assert "whose size it did not record" in check.describe()
    with pytest.raises(ValueError, match="whose size it did not record"):
        tier_sweep(plans, unsaid, (16,))


def test_the_shortfall_counts_the_hits_the_tier_gave_back_as_the_engine_loaded_them(tier_run):
    """The shortfall split on the same run: of each request's hit, the blocks its replica held only in the tier at
    the lookup are exactly the blocks the engine loaded back for it (its `tier_loaded` rows); the rest of the hit
    was in the cache, and a pause loss the tier saved is no loss."""
    from kvobs.analytics.cache.shortfall_split import shortfall, store_lookups

    store, cached = tier_run
    requests, steps = store.reads.requests(), store.reads.steps()
    lookups, _ = store_lookups(store, requests, steps, None, None)
    assert len(lookups) == len(requests)  # every request's chain is known on our engine
    loaded = store.reads.kv_events(kinds=["tier_loaded"]).groupby("request_id").size()
    tier = lookups.set_index("request_id")["tier_blocks"]
    assert tier[tier > 0].to_dict() == loaded.to_dict() and loaded.sum() > 0
    assert (lookups["own_blocks"] * 16).sum() == sum(cached)  # the hit, tier loads included, is what replies said
    (row,) = shortfall(lookups, "instance", total=None).to_dict("records")
    assert row["tier_tokens"] == 16 * loaded.sum() and row["pause_tokens"] == 0
