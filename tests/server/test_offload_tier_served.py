"""`kvobs serve --kv-offloading-size` end to end: sessions through the OpenAI API, the tier's loads in the replies'
cached tokens, the engine's own store rows, and its `/metrics` scraped by the collector's scraper into the same
store, where `kvobs doctor`'s tier checks read them: a tier that loads prefixes back passes; the same run with its
tier events gone is "tier events missing"; a run whose prefixes never come back is "tier stored but never hit".
Its hits by tier, read from the same counters, are what its block manager recorded."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import delete

from collectors.drops import DropCounter
from collectors.metrics.scraper import Scraper, ScrapeTarget
from instrumented_engine.server.launcher import EngineServer
from kvobs.analytics.cache.hits_by_tier import tier_hits
from kvobs.analytics.cache.tier_health import tier_checks
from kvobs.store import StoreWriter, open_store
from kvobs.store.rollup_tables import KVEventMinuteRow
from kvobs.store.schema import KVEventRow
from tests.server.conftest import ask_session, filler_prompt, running_server, scrape

TIER_BYTES = 64 * 737_280  # 64 blocks of SmolLM2's float32 KV, 16 tokens a block


@contextmanager
def _tier_server(smollm2_source, tmp_path) -> Iterator[tuple[EngineServer, StoreWriter, str]]:
    """A server with a 12-block cache and a CPU tier writing to a SQLite store, its /metrics scraped into the same
    store before and after what the body sends: (server, the store's writer, the store's URL)."""
    url = f"sqlite:///{tmp_path / 'tier.db'}"
    options = {"store_url": url, "instance": "eng"}
    with running_server(
        smollm2_source,
        num_blocks=12,
        max_model_len=160,
        kv_offloading_size=TIER_BYTES,
        dtype="float32",
        options=options,
    ) as server:
        store = open_store(url)
        writer = StoreWriter(store)
        scraper = Scraper([ScrapeTarget("eng", server.url + "/metrics")], writer, DropCounter())
        assert scraper.scrape(scraper.targets[0])
        yield server, writer, url
        time.sleep(0.5)  # (a reply goes out before the step's observers run: its metrics follow it)
        assert scraper.scrape(scraper.targets[0])
        writer.close()
        scraper.stop()
        store.close()


def _served(smollm2_source, tmp_path, prompts: list[tuple[str, str]]) -> tuple[str, list[int]]:
    """The prompts through `_tier_server`: the store's URL and each reply's cached tokens."""
    with _tier_server(smollm2_source, tmp_path) as (server, _, url):
        cached = [ask_session(server, session, text) for session, text in prompts]
    return url, cached


def test_a_tier_that_gives_prefixes_back_passes_and_one_without_events_is_named(smollm2_source, tmp_path):
    question = "plan a day in Rome with museums, lunch and a walk by the river."
    prompts = [
        ("a", f"Session a: {question}"),
        *((f"z{k}", filler_prompt(k)) for k in range(4)),
        ("a", f"Session a: {question}"),
    ]
    url, cached = _served(smollm2_source, tmp_path, prompts)
    assert cached[-1] > cached[0]  # a's prefix came back: from the tier, the fillers took it from the cache
    store = open_store(url)
    loaded = store.reads.kv_events(kinds=["tier_loaded"])
    assert len(loaded) and set(loaded["session_id"]) == {"a"}  # the engine's record: a's blocks, loaded back
    (check,) = tier_checks(store)
    assert check.ok and check.instance == "eng" and "loaded back" in check.words
    # hits by tier from its counters, as the engine's record says: the tier's tokens are the blocks it loaded back
    (hits,) = tier_hits(store).to_dict("records")
    assert hits["loaded_tokens"] == 16 * len(loaded) and hits["cache_tokens"] + hits["loaded_tokens"] == sum(cached)
    assert hits["prompt_tokens"] == store.reads.requests()["prompt_tokens"].sum()
    assert hits["load_s"] > 0  # the copies back, as the engine timed them
    # the tier named as vLLM 0.34 names it (its host memory: kvobs's CPU), with all the loaded tokens
    assert hits["tiers"] == "CPU" and hits["tokens_by_tier"] == f"CPU {hits['loaded_tokens']:,.0f}"
    with store.session() as session, session.begin():  # the connector's KV events switched off: none ever came
        session.execute(delete(KVEventRow).where(KVEventRow.kind == "tier_stored"))
        session.execute(delete(KVEventMinuteRow).where(KVEventMinuteRow.kind == "tier_stored"))
    (check,) = tier_checks(store)
    assert not check.ok and check.words.startswith("tier events missing: its offload tier stored ")
    store.close()
    done = subprocess.run([sys.executable, "-m", "kvobs.cli", "doctor", "--store", url], capture_output=True, text=True)
    assert done.returncode == 1 and "Offload tiers (their counters against their KV events):" in done.stdout
    assert "  ! eng: tier events missing: " in done.stdout


def test_a_tier_whose_prefixes_never_come_back_is_named(smollm2_source, tmp_path):
    url, cached = _served(smollm2_source, tmp_path, [(f"z{k}", filler_prompt(k)) for k in range(3)])
    store = open_store(url)
    assert not len(store.reads.kv_events(kinds=["tier_loaded"]))  # truth: nothing was loaded back
    (check,) = tier_checks(store)
    assert not check.ok and check.words.startswith("tier stored but never hit: its offload tier stored ")
    assert "vllm:external_prefix_cache_hits 0" in check.words
    store.close()


def test_a_store_larger_than_the_tier_is_refused_and_counted(smollm2_source):
    """A tier of 2 blocks and a prompt of more: vLLM's connector skips such a store and warns; kvobs counts it on
    /metrics (`kvobs_kv_offload_store_failures_total`), since vLLM exports no count of them."""
    with running_server(
        smollm2_source, num_blocks=12, max_model_len=160, kv_offloading_size=2 * 737_280, dtype="float32"
    ) as server:
        assert server.engine.engine.block_manager.tier.num_blocks == 2
        before = scrape(server.url)[("kvobs_kv_offload_store_failures_total", ())]
        ask_session(server, "z", filler_prompt(0))
        time.sleep(0.5)  # (a reply goes out before the step's observers run: its metrics follow it)
        after = scrape(server.url)[("kvobs_kv_offload_store_failures_total", ())]
    assert (before, after) == (0.0, 1.0)


def test_a_step_whose_pause_loss_the_tier_saved_tells_its_load_time(smollm2_source, tmp_path):
    """An agent's second step after fillers took its prefix from the cache while it waited: the tier gave it back.
    Its story says so with what the load cost at the replica's measured load rate (the engine's own load counters,
    scraped), beside what recomputing would have cost; the rate is the counters' own ratio."""
    import httpx

    from kvobs.agent import AgentSession
    from kvobs.agent.recorder import StoreStepRecorder
    from kvobs.analytics.cache.load_rates import LoadRates
    from kvobs.analytics.steps.story import step_story
    from tests.server.conftest import SERVED

    messages = [
        {"role": "user", "content": "Session a: plan a day in Rome with museums, lunch and a walk by the river."}
    ]
    with _tier_server(smollm2_source, tmp_path) as (server, writer, url):
        client = httpx.Client(base_url=server.url + "/v1", timeout=60)
        with AgentSession("planner", session_id="a", recorder=StoreStepRecorder(writer)) as session:
            with session.step() as step:
                step.chat(client, model=SERVED, messages=messages, max_tokens=2, temperature=0)
            for k in range(4):  # the pause: other sessions take a's blocks from the cache
                ask_session(server, f"z{k}", filler_prompt(k))
            with session.step() as step:
                step.chat(client, model=SERVED, messages=messages, max_tokens=2, temperature=0)
    store = open_store(url)
    loaded = store.reads.kv_events(kinds=["tier_loaded"])
    assert len(loaded) and set(loaded["session_id"]) == {"a"}  # truth: a's blocks, loaded back for its second step
    seconds = store.reads.metric_series(["vllm:kv_offload_load_time:increase"])["value"].sum()
    rate = LoadRates.from_store(store, None, None).at("eng", float(loaded["ts"].iloc[0]))
    assert rate.tokens == 16 * len(loaded) and rate.tokens_per_s == pytest.approx(rate.tokens / seconds)
    story = step_story(store, "a", 1)
    (fact,) = [f for f in story.step.record.evidence.split("; ") if "loaded back from the offload tier" in f]
    tokens = 16 * len(loaded)
    assert f"({tokens} tokens)" in fact and f"about {tokens / rate.tokens_per_s:.3f} s to load at " in fact
    store.close()
