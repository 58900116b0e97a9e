"""Hash-chain analytics (achieved vs available hit rate, recompute, reuse, churn) and pressure/latency windows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.cache.chains import (
    BlockGraph,
    eviction_churn,
    hit_rate_summary,
    hit_rates,
    prefix_reuse,
    recompute_by_session,
    request_chains,
    with_sessions,
)
from kvobs.analytics.cache.footprints import footprint_timeline, session_table
from kvobs.analytics.cache.pressure import lagged_correlation, pressure_windows, strongest_lag
from kvobs.analytics.windows import range_sums
from kvobs.semconv.reasons import RELEASE_REASONS
from kvobs.semconv.spans import BLOCK_LOSS_KINDS, STEP_JOINED
from kvobs.store.composed import releases_in


def chain_rates(store, block_size):
    reqs, stored = with_sessions(store.reads.requests(), store.reads.steps()), store.reads.stored_blocks()
    graph = BlockGraph.from_stored(stored)
    chains = request_chains(reqs, stored, graph)
    return reqs, stored, graph, chains, hit_rates(reqs, chains, graph, block_size=block_size)


def test_unlimited_cache_hits_at_least_what_the_engine_hit(agent_run):
    reqs, stored, graph, chains, rates = chain_rates(agent_run.store, 16)
    assert set(chains) == set(reqs["request_id"])  # kvobs serve records request ids on stored blocks
    for req in reqs.itertuples():  # a chain covers the request's full blocks, root first
        assert len(chains[req.request_id]) >= req.prompt_tokens // 16
    assert (rates["available_tokens"] >= rates["cached_tokens"]).all()
    summary = hit_rate_summary(rates)
    assert summary["available"] > summary["achieved"] > 0  # evictions cost hits the chains show were possible
    assert summary["recompute_tokens"] == rates["recompute_tokens"].sum() > 0
    first = rates.sort_values("arrival_ts").iloc[0]
    assert first["available_tokens"] == 0 == first["cached_tokens"]  # nothing cached before the first request
    by_session = recompute_by_session(rates, agent_run.store.reads.kv_events(kinds=["preempted"]))
    assert by_session["total"].sum() == summary["recompute_tokens"] + by_session["preempted_tokens"].sum()


def test_shared_system_prompt_is_the_top_prefix(agent_run):
    _, stored, graph, _, _ = chain_rates(agent_run.store, 16)
    reuse = prefix_reuse(stored)
    assert reuse.iloc[0]["sessions"] >= 3  # every kind starts with the shared system prompt
    churn = eviction_churn(stored)
    assert churn["restored_blocks"] > 0 and 0 < churn["churn"] < 1
    assert churn["extra_stores"] == len(stored) - churn["blocks"]  # one engine: every store beyond the first


def test_vllm_chains_from_session_and_time(vllm_run):
    store = vllm_run.store
    reqs, stored, graph, chains, rates = chain_rates(store, 128)
    assert stored["request_id"].isna().all()  # vLLM's events carry no request id
    assert len(chains) >= 0.8 * len(reqs)
    assert rates["cached_tokens"].isna().all()  # vLLM's spans carry no cached tokens: achieved comes from metrics
    assert hit_rate_summary(rates)["available_all"] > 0


def test_pressure_windows_from_the_engine_run(agent_run):
    store = agent_run.store
    first, last = store.reads.time_range()
    frame = pressure_windows(range_sums(store, first, last, 5), store.reads.block_losses(bucket_s=5), window_s=5)
    assert {"usage_mean", "evictions_per_s", "ttft_p99", "itl_p50", "preemptions", "requests"} <= set(frame)
    assert frame["requests"].sum() == len(store.reads.requests())
    lost = store.reads.block_losses(bucket_s=5)["blocks"].sum()
    assert np.isclose(frame["evictions_per_s"].sum() * 5, lost)
    assert frame["preemptions"].sum() == len(store.reads.kv_events(kinds=["preempted"]))


def test_blocks_lost_counts_each_lost_block_once_however_many_sessions_owned_it(agent_run):
    """The one definition of "blocks lost": one per (instance, time, block) loss, whatever the owner rows; blocks the
    agents released (their sessions ended) are no loss, counted apart. (Whether this timed run evicts a block two
    sessions share varies; tests/observers/test_agreement.py makes it happen.)"""
    store = agent_run.store
    rows = store.reads.kv_events(kinds=BLOCK_LOSS_KINDS)
    released = rows["reason"].isin(list(RELEASE_REASONS))
    keys = ["instance", "ts", "block_hash", "kind", "reason"]
    distinct, let_go = rows[~released].drop_duplicates(keys), rows[released].drop_duplicates(keys)
    assert len(rows) >= len(distinct) > 0  # shared blocks are recorded once per owning session
    assert store.reads.block_losses(bucket_s=1e12)["blocks"].sum() == len(distinct)
    by_bucket = store.reads.block_losses(bucket_s=5)
    assert by_bucket["blocks"].sum() == len(distinct)  # buckets only split it
    counts = store.reads.kv_event_counts(bucket_s=1e12)
    assert releases_in(counts)["blocks"].sum() == len(let_go) > 0  # the SDK released its ended sessions


def test_lagged_correlation_finds_the_lead():
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    frame = pd.DataFrame({"pressure": x, "latency": np.roll(x, 2) + rng.normal(scale=0.1, size=60)})
    corr = lagged_correlation(frame, "pressure", "latency", max_lag=4, window_s=10)
    best = strongest_lag(corr)
    assert best["lag"] == 2 and best["lag_s"] == 20 and best["r"] > 0.95
    assert len(corr) == 9
    flat = lagged_correlation(pd.DataFrame({"a": [1.0] * 10, "b": range(10)}), "a", "b")
    assert flat["r"].isna().all() and strongest_lag(flat) is None


def test_footprints_and_session_table(agent_run):
    store = agent_run.store
    session = store.reads.sessions()["session_id"].iloc[0]
    timeline = footprint_timeline(store.reads.session_snapshots(session))
    assert timeline["session_evicted_blocks"].is_monotonic_increasing
    assert timeline["lost_since_previous"].sum() == timeline["session_evicted_blocks"].iloc[-1]
    table = session_table(store.reads.sessions(), store.reads.session_footprints(), store.reads.step_outcomes())
    assert len(table) == 6 and table["steps"].sum() == 18 and table["failed"].sum() == agent_run.result.num_failed


def test_step_outcomes_are_the_steps_aggregated_per_session(agent_run, vllm_run):
    """`step_outcomes` is what the Sessions page once computed from every step row: per session, steps, failures, the
    median end-to-end time, the token sums of the steps that give both (None where none does), and the steps the
    collector judged and joined to their requests."""
    for store in (agent_run.store, vllm_run.store):
        first, last = store.reads.time_range()
        for since, until in ((None, None), (first + (last - first) / 3, last)):
            steps = store.reads.steps(since, until)
            known = steps.dropna(subset=["prompt_tokens", "cached_tokens"])
            tokens = known.groupby("session_id")[["cached_tokens", "prompt_tokens"]].sum()
            expected = steps.groupby("session_id").agg(
                steps=("step_index", "size"),
                failed=("status", lambda s: int((s == "error").sum())),
                e2e_p50=("e2e_s", "median"),
            )
            joins = steps.groupby("session_id")["request_join"].agg(
                judged=lambda s: int(s.notna().sum()), joined=lambda s: int(s.isin(STEP_JOINED).sum())
            )
            expected = expected.join(tokens).join(joins).reset_index()
            got = store.reads.step_outcomes(since, until)
            assert len(got) == len(expected) > 0
            pd.testing.assert_frame_equal(
                got.astype({c: float for c in ("e2e_p50", "cached_tokens", "prompt_tokens")}),
                expected.astype({c: float for c in ("e2e_p50", "cached_tokens", "prompt_tokens")}),
                check_dtype=False,
            )


def test_available_counts_blocks_stored_while_a_request_waited_in_the_queue():
    """B arrives at t=1 and waits 1 s; A stores the shared block at t=1.5: B's lookup (t=2) could hit it."""
    stored = pd.DataFrame(
        {
            "ts": [1.5, 2.5],
            "block_hash": [11, 12],
            "parent_hash": [None, 11],
            "num_tokens": [16, 16],
            "session_id": ["a", "b"],
            "request_id": ["A", "B"],
        }
    )
    reqs = pd.DataFrame(
        {
            "request_id": ["A", "B"],
            "session_id": ["a", "b"],
            "arrival_ts": [0.0, 1.0],
            "queue_s": [0.0, 1.0],
            "finished_ts": [1.6, 3.0],
            "prompt_tokens": [20, 40],
            "cached_tokens": [0, 16],
        }
    )
    graph = BlockGraph.from_stored(stored)
    rates = hit_rates(reqs, request_chains(reqs, stored, graph), graph, block_size=16).set_index("request_id")
    assert rates.loc["B", "available_tokens"] == 16 == rates.loc["B", "cached_tokens"]
    assert rates.loc["A", "available_tokens"] == 0
    no_wait = reqs.assign(queue_s=[0.0, 0.0])
    rates = hit_rates(no_wait, request_chains(no_wait, stored, graph), graph, block_size=16).set_index("request_id")
    assert rates.loc["B", "available_tokens"] == 0  # looked up at 1.0, before the block existed


def test_vectorized_roots_equal_the_walk_on_random_forests():
    """`chain_roots` (numpy pointer jumping) = `BlockGraph.root` (the walk), on forests with repeated stores, parents
    never stored, missing parents, the edges of 64 bits, and a cycle (which takes the walk's fallback)."""
    import numpy as np

    from kvobs.analytics.cache.chains import chain_roots

    rng = np.random.default_rng(7)
    for case in range(40):
        n = int(rng.integers(1, 400))
        edges = np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64)
        pool = rng.choice(np.concatenate([edges, rng.integers(0, 2**63, 600).astype(np.uint64)]), size=n)
        hashes = pool[rng.integers(0, n, n)]
        parents = pool[rng.integers(0, n, n)]
        no_parent = rng.random(n) < 0.3
        if case % 10 == 0 and n > 2:  # a two-block cycle
            hashes[:2], parents[:2], no_parent[:2] = [5, 6], [6, 5], False
        else:  # forests: a block's parent is stored before it
            order = {int(h): i for i, h in reversed(list(enumerate(hashes)))}
            for i in range(n):
                if order.get(int(parents[i]), n) >= order[int(hashes[i])]:
                    no_parent[i] = True
        stored = pd.DataFrame(
            {
                "ts": np.arange(n, dtype=float),
                "block_hash": hashes.astype(object),
                "parent_hash": np.where(no_parent, None, parents.astype(object)),
            }
        )
        graph = BlockGraph.from_stored(stored)
        expected = [graph.root(int(h)) for h in hashes]
        assert chain_roots(hashes, parents, no_parent).tolist() == expected, case


def test_a_range_that_starts_mid_run_counts_only_its_own_preemptions(vllm_run):
    """The preemption counter's value at a range's first snapshot holds the run's earlier preemptions: the Overview's
    count, its windows and the alert signal all count from the value before the range, so they equal the counter's
    rise over the range, read from the raw snapshots (the last before the range to the last in it). On the recorded
    vLLM run, whose scraped `vllm:num_preemptions` rises from 0 to 9 (an engine run's preemptions vary with timing)."""
    from dashboard import data
    from dashboard.context import bucket_for
    from kvobs.alerts.signals import preemptions_per_min

    store = vllm_run.store
    snaps = store.reads.instance_snapshots().dropna(subset=["preemptions_total"])
    first, last = store.reads.time_range()
    totals = snaps.set_index("ts")["preemptions_total"].astype(float)
    since = next(
        (float(ts) + 1e-3 for ts, total in totals.items() if 0 < total < totals.iloc[-1]), None
    )  # just after a snapshot that already counts some preemptions, before the last rise
    assert since is not None, "the recording must preempt before and after some snapshot"
    before, end = totals[totals.index < since].iloc[-1], totals[totals.index <= last].iloc[-1]
    assert before > 0 and end > before
    window = bucket_for(since, last, at_least=5.0)
    overview = data.overview(store, since, last, window)
    assert overview.kpis["preemptions"] == end - before
    pressure = data.pressure(store, since, last, window, "evictions_per_s", "ttft_mean").windows
    assert pressure["preemptions"].sum() == end - before
    assert data.overview(store, since, last, window, per_instance=True).fleet.table["preemptions"].sum() == (
        end - before
    )
    [(_, _, per_min)] = preemptions_per_min(store, since, last)
    assert np.isclose(per_min * (last - since) / 60.0, end - before)
