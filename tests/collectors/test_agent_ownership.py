"""The KV story of a framework agent's steps with no header in the agent: three conversations at once (LangChain,
the OpenAI Agents SDK, smolagents, LlamaIndex and Agno traced by their OpenInference instrumentation, pydantic-ai by its
own and a plain OpenAI client loop by OTel's `openai-v2`), on a `kvobs serve` whose cache
is too small for all three, so blocks are evicted while conversations wait on their tools. No block names a
session; the collector joins each step to its request and ties the blocks each request stored to the step's session
(ownership by inference). Checked against the engine's own block manager (which request stored each block, which
blocks it evicted and when) and the ids the agent was answered (which session sent each request)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from prometheus_client import generate_latest

from instrumented_engine.engine import events as ev
from kvobs.commands.doctor import exposition_checks
from kvobs.semconv.reasons import PRESSURE_REASONS
from tests.collectors.agent_harness import FIXTURES, served_and_collected
from tests.collectors.test_agent_kv_fixtures import in_pause, losses
from tests.dashboard.test_app import assert_clean, open_page

# names of different lengths: conversations whose prompts differ in length, as real ones do (three of one length,
# started together, would be told apart by nothing but their content, which the collector never sees)
CONVERSATIONS = ["oslo", "porto-and-the-douro-valley", "lisbon-sintra-cascais-and-the-algarve-coast"]


class BlockTruth:
    """The engine's block manager as it ran: each store (which request) and each eviction (which reason)."""

    def __init__(self) -> None:
        self.stored: list[tuple[float, int, str]] = []
        self.evicted: list[tuple[float, int, str]] = []

    def on_step(self, result) -> None:
        for event in result.events:
            if isinstance(event, ev.BlocksStored):
                self.stored += [(event.ts, h, event.request_id) for h in event.block_hashes]
            elif isinstance(event, ev.BlockEvicted):
                self.evicted.append((event.ts, event.block_hash, event.reason.value))

    def losses(self, session_of: dict[str, str], requests, unowned: set[int]) -> tuple[Counter, Counter, dict]:
        """Per session, the blocks it lost, those lost while it waited on a tool (between two of its requests), and
        block -> [(when evicted, the session whose request stored it last)]; `unowned`: blocks given to no session
        (a prefix prefilled by two at once), left out of the counts."""
        lost, paused, owner_at = Counter(), Counter(), {}
        for ts, block, reason in sorted(self.evicted):
            stores = [(at, rid) for at, h, rid in self.stored if h == block and at <= ts]
            session = session_of.get(max(stores)[1]) if stores else None
            owner_at.setdefault(block, []).append((ts, session))
            if session is None or reason not in {r.value for r in PRESSURE_REASONS} or block in unowned:
                continue
            lost[session] += 1
            mine = requests[requests["session_id"] == session].sort_values("arrival_ts")
            paused[session] += in_pause(mine, ts)
        return lost, paused, owner_at


# LangChain's, LlamaIndex's, pydantic-ai's and the plain client's steps are joined by the id in their spans, the
# Agents SDK's, smolagents' and Agno's by timing; each but LangChain on SQLite alone (the replay of each recording
# runs on every backend: test_agent_kv_fixtures.py)
CASES = [
    ("langchain", "sqlite"),
    ("langchain", "postgresql"),
    ("openai_agents", "sqlite"),
    ("smolagents", "sqlite"),
    ("llamaindex", "sqlite"),
    ("pydantic_ai", "sqlite"),
    ("plain_loop", "sqlite"),
    ("agno", "sqlite"),
]
AGENT_PARAMS = {"plain_loop": {"instrumentation": "openai-v2"}}  # the official OTel GenAI instrumentation


@pytest.mark.parametrize("scenario,store_url", CASES, indirect=["store_url"])
def test_a_framework_agents_blocks_and_tool_pause_losses_are_its_sessions_with_no_header(
    smollm2_source, store, monkeypatch, scenario
):
    truth = BlockTruth()
    record = f"{scenario.replace('_', '-')}-kv-ownership"  # (written only with KVOBS_RECORD_AGENT_FIXTURES=1)
    with served_and_collected(smollm2_source, store, service=scenario, num_blocks=34, record=record) as h:
        h.server.engine.observers.append(truth)
        answered = h.agent(scenario, conversations=CONVERSATIONS, concurrent=True, **AGENT_PARAMS.get(scenario, {}))[
            "answered"
        ]
    _, sessions, footprints, paused = held_to_the_engine(h, truth, answered, store)

    # the Sessions page says whose blocks are owned by inference, and how many of the session's requests
    at = open_page(monkeypatch, store.url, "sessions")
    at.selectbox(key="session").set_value(sessions[1]).run()
    assert_clean(at)
    said = [c.value for c in at.caption if "named no session" in c.value]
    told = "3 of its requests stored KV blocks that named no session (no X-Session-ID reached the server with them)"
    assert said and f"{told}: 3 tied to it by inference" in said[0], said
    if os.environ.get("KVOBS_RECORD_AGENT_FIXTURES") == "1":  # what its replay is held to
        sessions = {s: {"lost": footprints[s].removed, "lost_in_pause": paused[s]} for s in sessions}
        kv_truth = {"requests_tied": dict(h.collector.block_owners.requests_tied), "sessions": sessions}
        (FIXTURES / record / "kv_truth.json").write_text(json.dumps(kv_truth, indent=1) + "\n")


# six conversations whose names are 20 or more characters apart (six repeats of the brief: 25 or more tokens), so no
# two of their requests are of one depth in blocks; of equal depths at once, the collector could tell them apart by
# nothing but their content, which it never sees, and rightly calls them ambiguous
SIX = [
    *CONVERSATIONS,
    "stockholm-uppsala-and-the-archipelago-islands-by-ferry-and-train",
    "copenhagen-aarhus-odense-and-the-jutland-coast-by-bike-with-the-children-all-summer",
    "edinburgh-glasgow-the-highlands-skye-and-the-outer-hebrides-by-car-and-ferry-with-a-stop-at-every-castle",
]


def test_six_overlapping_sessions_sharing_a_system_prompt_lose_what_the_engine_says_they_lost(smollm2_source, store):
    """Six conversations at once, one system prompt, on a cache too small for them (a plain client loop traced by
    OTel's `openai-v2`, no header): their requests overlap on one replica and the prompt's blocks are stored by one
    of them and found by the rest. Every request is still tied; the system prompt's blocks that several prefilled at
    once are nobody's; every other block is charged to the session whose request stored it, as the header path names
    it (vLLM names the storer's session on `BlockStored`); each session's losses in its tool pauses are the engine's."""
    truth = BlockTruth()
    with served_and_collected(smollm2_source, store, service="plain_loop", num_blocks=90, max_model_len=1024) as h:
        h.server.engine.observers.append(truth)
        answered = h.agent("plain_loop", conversations=SIX, concurrent=True, instrumentation="openai-v2")["answered"]
    _, sessions, _, paused = held_to_the_engine(h, truth, answered, store)
    assert len(sessions) == 6 and sum(n > 0 for n in paused.values()) >= 3  # sessions lost blocks in their pauses


def held_to_the_engine(h, truth: BlockTruth, answered: dict, store) -> tuple[str, list, dict, Counter]:
    """What the collector made of a run with no header, against the engine's block manager and the ids each session
    was answered: every request tied by inference (and said), every stored block its storer's session's or, for a
    prefix two requests prefilled at once, none's, each removal named for the session whose request stored the block,
    and each session's losses and losses in its tool pauses as the engine counted them. Returns the collector's
    exposition, the sessions, the stream's footprints and the engine's pause losses per session."""
    exposed = generate_latest(h.collector.registry).decode()
    sessions = list(answered)  # (CONVERSATIONS, or the traces of a plain loop: a session each)
    session_of = {rid: session for session, ids in answered.items() for rid in ids}
    n = len(session_of)
    requests = store.reads.requests().assign(session_id=lambda f: f["request_id"].map(session_of))
    removed = store.reads.kv_events(kinds=["removed"])
    unowned = {int(b) for b in removed.loc[removed["session_id"].isna(), "block_hash"]}
    lost, paused, owner_at = truth.losses(session_of, requests, unowned)
    assert sum(paused.values()) > 0  # the cache was small enough: tool pauses lost blocks

    # every request's blocks tied to its session, and said
    assert h.collector.block_owners.requests_tied == Counter({"inference": n}), h.collector.block_owners.requests_tied
    assert f'kvobs_collector_requests_tied_total{{tie="inference"}} {n}.0' in exposed
    said = f"of {n} requests whose KV blocks named no session, {n} tied or all cached"
    assert ("(KV blocks tied by inference)", True, said) in exposition_checks(exposed)  # `kvobs doctor --collector`
    stored_by = Counter(session_of[rid] for _, _, rid in truth.stored)
    footprints = h.collector.streams[0].ingest.chains.footprints
    # a session owns what its requests stored, but for a prefix two requests prefilled at once (either may have
    # stored it: neither is given it, whichever one the engine credited): every stored block is its session's or none's
    for session in sessions:
        assert footprints[session].stored <= stored_by[session], (session, footprints[session], stored_by)
    assert sum(footprints[s].stored for s in sessions) + footprints[None].stored == len(truth.stored)
    assert footprints[None].stored <= max(stored_by.values()) // 2  # a shared prefix, never a conversation's own
    # each removal the store names a session for was of a block that session's request stored; the others, of the
    # blocks given to none
    assert len(removed) == len(truth.evicted)  # every removal stored, the held ones too (the collector's stop)
    named = removed[removed["session_id"].notna()]
    assert len(named) == sum(lost.values()) and len(unowned) <= footprints[None].stored
    for block, ts, session in zip(named["block_hash"], named["ts"], named["session_id"]):
        # (the removal's time is its KV batch's: the engine's eviction's own)
        assert min(owner_at[int(block)], key=lambda e: abs(e[0] - ts))[1] == session
    # the losses in tool pauses, as the sessions' footprints tell them, are the engine's
    assert losses(store, sessions) == {s: {"lost": lost[s], "lost_in_pause": paused[s]} for s in sessions}

    return exposed, sessions, footprints, paused
