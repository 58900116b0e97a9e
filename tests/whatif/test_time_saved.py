"""The what-if's time saved, against the truth: the same scripted agent traffic run on our engine at two cache sizes.
The what-if over the small run predicts the prefill time the larger size saves; the larger run measures it (each
step's prefill, scheduled to first token, matched by session and step)."""

from __future__ import annotations

import re
from contextlib import ExitStack

import httpx
import pandas as pd
import pytest

from instrumented_engine.whatif.fidelity import fidelity
from instrumented_engine.whatif.replay import ReplayPlan, simulate
from instrumented_engine.whatif.runs import observed_total, replay_plans, simulate_runs
from instrumented_engine.whatif.time_saved import Prices, request_costs, time_saved
from instrumented_engine.whatif.units import ReplayRequest, WhatIfResult
from kvobs.store import open_store
from tests.server.conftest import SERVED, running_server
from tests.whatif.helpers import whatif

# four agents, each with its own 1,536-token context, take turns one request at a time, three rounds: SMALL blocks
# of 16 tokens hold one agent's context (each turn evicts the next agent's), LARGE hold them all
SMALL, LARGE = 130, 600
AGENTS, ROUNDS, CONTEXT, TURN = 4, 3, 1536, 32
WARM = (1536, 64, 256, 768, 1152)


def _prompt(agent: int, round_: int) -> list[int]:
    """The agent's context and its turns so far: token ids no other agent's prompt shares."""
    base = 1000 + agent * 5000
    return [base + (i * 7) % 4999 for i in range(CONTEXT + TURN * round_)]


def _turns() -> list[tuple[str, list[int]]]:
    """First, one-off prompts of several lengths: the first long forward pass pays its one-off costs, and the prefill
    rate's fit sees a prompt's fixed cost apart from its cost per token; then the agents' turns."""
    turns = [(f"warm-{n}", [30000 + 3 * n + i % 97 for i in range(n)]) for n in WARM]
    return turns + [(f"agent-{a}", _prompt(a, r)) for r in range(ROUNDS) for a in range(AGENTS)]


@pytest.fixture(scope="module")
def two_sizes(smollm2_source, tmp_path_factory):
    """The traffic at `SMALL` blocks and at `LARGE`, on two engines up at once, each turn sent to one and then the
    other (which first alternating): a shared machine's speed drifts over a run, and two runs one after the other
    would price the drift as cache. (small url, small store, large store)"""
    urls = {size: f"sqlite:///{tmp_path_factory.mktemp(f'blocks{size}') / 'kvobs.db'}" for size in (SMALL, LARGE)}
    with ExitStack() as stack:
        servers = {
            size: stack.enter_context(
                running_server(
                    smollm2_source,
                    options={"store_url": url, "snapshot_interval_s": 0.5, "instance": "engine-test"},
                    num_blocks=size,
                    max_model_len=2048,
                )
            )
            for size, url in urls.items()
        }
        for i, (session, prompt) in enumerate(_turns()):
            body = {"model": SERVED, "prompt": prompt, "max_tokens": 2, "temperature": 0}
            for size in (SMALL, LARGE) if i % 2 == 0 else (LARGE, SMALL):
                reply = httpx.post(
                    servers[size].url + "/v1/completions", json=body, headers={"X-Session-ID": session}, timeout=120
                )
                assert reply.status_code == 200, reply.text
    return urls[SMALL], open_store(urls[SMALL]), open_store(urls[LARGE])


def _prefills(store) -> pd.DataFrame:
    """Each request's prefill seconds (scheduled to first token) and cached tokens, keyed by (session, step)."""
    reqs = store.reads.requests().sort_values("arrival_ts")
    reqs = reqs.assign(
        step=reqs.groupby("session_id").cumcount(),
        prefill_s=reqs["first_token_ts"] - (reqs["arrival_ts"] + reqs["queue_s"]),
    )
    return reqs.set_index(["session_id", "step"])[["request_id", "prefill_s", "cached_tokens"]]


def test_the_time_a_larger_cache_saves_is_the_time_the_larger_run_saved(two_sizes):
    """Truth: per step, the small run's prefill less the large run's. The what-if, from the small run's store alone,
    prices each step's extra hits at the small run's measured prefill rate: the same steps gain the same tokens, and
    the time it predicts is within a quarter of the time the larger run saved."""
    _, small, large = two_sizes
    plans = replay_plans(small)
    total, _ = simulate_runs(plans, num_blocks=LARGE, policy="lru")
    _, checks = fidelity(plans, observed_total(plans, small, None, None)["hit"])
    assert all(check.reproduces for check in checks)  # our engine's runs replay step for step
    saved = time_saved(total, request_costs([c.replay for c in checks]), Prices.from_store(small, plans))
    assert saved.unpriced == 0 and len(saved.saved_s) == len(WARM) + AGENTS * ROUNDS

    both = pd.merge(
        _prefills(small), _prefills(large), left_index=True, right_index=True, suffixes=("_small", "_large")
    )
    assert len(both) == len(WARM) + AGENTS * ROUNDS  # the same steps in both runs
    gained = both["cached_tokens_large"] - both["cached_tokens_small"]
    assert (gained > 0).sum() == AGENTS * (ROUNDS - 1)  # each agent's later turns: its context kept
    predicted = {rid: total.request_hits[rid] for rid in both["request_id_small"]}
    assert [predicted[rid] for rid in both["request_id_small"]] == both["cached_tokens_large"].tolist()
    # the steps whose hits are the same in both runs save nothing, exactly; on those that gain, the time the larger
    # run saved, step by step (its median: one step's prefill can stall on this shared machine, in either run)
    saved_by_id = saved.by_request
    gains = both[gained > 0]
    assert all(saved_by_id[rid] == 0 for rid in both[gained == 0]["request_id_small"])
    predicted_s = pd.Series([saved_by_id[rid] for rid in gains["request_id_small"]])
    measured_s = gains["prefill_s_small"] - gains["prefill_s_large"]
    assert (measured_s > 0).all() and (predicted_s > 0).all(), both.to_string()
    assert predicted_s.median() == pytest.approx(measured_s.median(), rel=0.25), (predicted_s, both.to_string())
    assert predicted_s.sum() == pytest.approx(measured_s.sum(), rel=0.25), (predicted_s, both.to_string())
    # one request at a time: the engine's prefill time is the requests' own, so it saves what the steps save
    assert Prices.from_store(small, plans).overlap == {"engine-test": pytest.approx(1.0)}
    assert saved.engine_s == pytest.approx(sum(saved.saved_s))


def test_kvobs_whatif_prints_the_time_saved_and_its_price(two_sizes):
    url = two_sizes[0]
    out = whatif(url, "--num-blocks", f"{SMALL},{LARGE}", "--gpu-hour-cost", "2.5", "--gpus-per-engine", "2")
    assert "Time to first token:" in out and "engine-test:" in out and "tokens/s over" in out
    table = out.split("Time to first token:")[1]
    lines = [line for line in table.splitlines() if line.startswith("| lru")]
    assert len(lines) == 2, table
    at_small, at_large = ([c.strip() for c in line.split("|")[1:-1]] for line in lines)
    assert at_small[1] == str(SMALL) and at_large[1] == str(LARGE)
    assert at_small[3:5] == ["+0.000", "+0.000"] and at_small[7] == "+0.0"  # the observed point saves nothing
    assert at_large[5] == str(AGENTS * (ROUNDS - 1)) and at_large[6] == "0"  # steps faster, slower
    prefill_s = float(at_large[7].replace(",", ""))  # (the engine's: one prefill at a time, the steps' own)
    hours = float(at_large[8])
    assert prefill_s > 0 and hours == pytest.approx(prefill_s * 2 / 3600, rel=0.05)
    assert float(at_large[9]) == pytest.approx(hours * 2.5, rel=0.01)
    assert re.search(r"GPU-hours: those seconds x 2 GPU", out)


def _request(rid: str, start: float, prompt: int) -> ReplayRequest:
    return ReplayRequest(rid, "s", start, start + 1.0, prompt, prompt, tuple(range(prompt // 16)))


def test_a_step_without_a_rate_is_not_priced_and_loads_are_priced_at_the_load_rate(agent_run):
    """Hand-computed: rates from the agent run's own requests; a request of an instance with no rows is unpriced,
    never counted as zero; a step that hits 32 more tokens saves 32 / the rate's tokens per second."""
    store = agent_run.store
    reqs = store.reads.requests()
    first = reqs.iloc[0]
    plan = ReplayPlan([_request(first["request_id"], float(first["arrival_ts"]), 64)], 16)
    prices = Prices.from_store(store, [plan])
    rate = prices.rates.at("engine-test", float(first["arrival_ts"]) + 300.0)
    assert rate is not None
    base = {first["request_id"]: (0, 0), "elsewhere": (0, 0)}
    result = WhatIfResult(10, "lru", request_hits={first["request_id"]: 32, "elsewhere": 32})
    saved = time_saved(result, base, prices)
    assert saved.unpriced == 1 and saved.saved_s == pytest.approx((32 / rate.tokens_per_s,))
    # the same hits loaded from a tier whose load rate nobody measured: not priced
    loaded = WhatIfResult(10, "lru", request_hits={first["request_id"]: 32}, request_loads={first["request_id"]: 32})
    assert time_saved(loaded, base, prices).unpriced == 1
    assert simulate(plan, num_blocks=10).request_hits == {first["request_id"]: 0}
