"""Dynamo's request-trace rows joined with the KV events of the worker that served them, live: a real `kvobs serve`
publishes vLLM's KV events naming no session (as a vLLM behind Dynamo's frontend does), a real `kvobs collect` follows
a directory of trace rows written as Dynamo's JSONL sink writes them. Truth is the script: two agents' first prompts
are evicted by a third's during their tool pauses, one agent's row read before the eviction and the other's after it.
Each row names its prompt's blocks by Dynamo's hashes (`kvobs.dynamo_hashes`, checked against Dynamo's own rows in
`tests/formats/test_dynamo_hashes.py`)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from kvobs.analytics.steps.attribution import ATTRIBUTION_KINDS, attribute_steps
from kvobs.commands.doctor import exposition_checks
from kvobs.dynamo_hashes import sequence_hashes
from kvobs.semconv.spans import TraceJoin
from tests.server.conftest import SERVED, free_port, running_server
from tests.waiting import wait_for

WORKER = 5442499199660933941  # the worker id Dynamo's row names: not the collector's name for the stream
STREAM = "worker-a"


def _tokens(seed: int, n: int) -> list[int]:
    return [1000 + seed * 3001 + (i * 13) % 2999 for i in range(n)]


class Agent:
    """Sends prompts to the engine and writes each request's `request_end` row as Dynamo's frontend would."""

    def __init__(self, url: str, trace: Path, worker: int = WORKER) -> None:
        self.url, self.trace, self.worker = url, trace, worker
        self.pending: list[dict] = []

    def ask(self, session: str, prompt: list[int]) -> dict:
        start = time.time()
        body = {"model": SERVED, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        reply = httpx.post(self.url + "/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        end = time.time()
        usage = reply.json()["usage"]
        request = {
            "request_id": str(uuid.uuid4()),
            "model": SERVED,
            "input_tokens": len(prompt),
            "output_tokens": usage["completion_tokens"],
            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "request_received_ms": start * 1000,
            "ttft_ms": (end - start) * 500,
            "total_time_ms": (end - start) * 1000,
            "worker": {"prefill_worker_id": self.worker, "decode_worker_id": self.worker},
            "replay": {
                "trace_block_size": 16,
                "input_length": len(prompt),
                "input_sequence_hashes": sequence_hashes(prompt, 16),
            },
        }
        row = _row("request_end", end, {"session_id": session}, request=request)
        self.pending.append(row)
        return {"start": start, "end": end, **request}

    def tool(self, session: str, seconds: float) -> None:
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        tool = {"tool_call_id": str(uuid.uuid4()), "tool_class": "search", "status": "succeeded"}
        tool |= {"started_at_unix_ms": start * 1000, "ended_at_unix_ms": end * 1000}
        self.pending.append(_row("tool_end", end, {"session_id": session}, tool=tool))

    def flush(self) -> None:
        with self.trace.open("a") as f:
            f.write("".join(json.dumps({"timestamp": 0, "event": row}) + "\n" for row in self.pending))
        self.pending.clear()


def _row(kind: str, at: float, context: dict, **body) -> dict:
    return {
        "schema": "dynamo.request.trace.v1",
        "event_type": kind,
        "event_time_unix_ms": int(at * 1000),
        "agent_context": context,
        **body,
    }


def test_each_row_is_its_workers_request_and_its_blocks_are_its_sessions(smollm2_source, store, tmp_path):
    kv = free_port()
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    trace = trace_dir / "dynamo-request-trace.jsonl"
    # 23 usable blocks: the coder's two 240-token prompts (15 blocks each) evict whatever was cached before them
    with running_server(
        smollm2_source, options={"kv_events_endpoint": f"tcp://*:{kv}"}, num_blocks=24, max_model_len=256
    ) as server:
        collector = Collector(
            CollectorOptions(kv_events=[f"{STREAM}=tcp://127.0.0.1:{kv}"], dynamo_trace=str(trace_dir)),
            store=store,
        )
        collector.start()
        try:
            time.sleep(0.5)  # (a PUB drops what it sends before the subscription reaches it)
            joins = collector.dynamo.join.outcomes
            agent = Agent(server.url, trace)
            first = {"planner": agent.ask("planner", _tokens(1, 100))}
            agent.flush()  # the planner's row is read while its blocks are resident
            wait_for(lambda: joins[TraceJoin.JOINED.value] == 1)
            first["researcher"] = agent.ask("researcher", _tokens(2, 100))  # its row is read after they are gone
            agent.tool("planner", 0.2)
            agent.tool("researcher", 0.2)
            agent.ask("coder", _tokens(3, 240))
            agent.ask("coder", _tokens(4, 240))
            agent.flush()
            wait_for(lambda: joins[TraceJoin.JOINED.value] == 4)
            agent.ask("planner", _tokens(1, 100) + _tokens(5, 40))
            agent.ask("researcher", _tokens(2, 100) + _tokens(6, 40))
            agent.flush()
            wait_for(lambda: joins[TraceJoin.JOINED.value] == 6)
            server.shutdown()
        finally:
            collector.stop()
    assert sum(joins.values()) == joins[TraceJoin.JOINED.value] == 6
    said = {name: (ok, words) for name, ok, words in exposition_checks(generate_latest(collector.registry).decode())}
    assert said["(Dynamo rows joined with KV events)"] == (
        True,
        "6 requests joined to the stream that held their blocks",
    )
    requests = store.reads.requests()
    assert set(requests["instance"]) == {STREAM}  # each row's request is the stream's, not `worker-<id>`'s

    stored, removed = (store.reads.kv_events(kinds=[kind]) for kind in ("stored", "removed"))
    for session, request in first.items():
        during = stored[(stored["ts"] >= request["start"]) & (stored["ts"] <= request["end"])]
        assert len(during) == 6 and during["session_id"].isna().all()  # 102 tokens: 6 blocks, naming no session
        lost = removed[removed["block_hash"].isin(set(during["block_hash"])) & (removed["ts"] < request["end"] + 60)]
        assert len(lost) == 6 and (lost["session_id"] == session).all(), lost  # each removal is its session's

    steps = attribute_steps(store.reads.steps(), requests, store.reads.kv_events(kinds=ATTRIBUTION_KINDS)).set_index(
        ["session_id", "step_index"]
    )
    for session in first:
        step = steps.loc[(session, 1)]
        assert step["blocks_lost_in_pause"] == 6 and "prefix_evicted_in_pause" in step["causes"], step
    assert steps.loc[("coder", 1), "blocks_lost_in_pause"] == 0


def test_two_workers_in_worker_processes_each_request_to_the_stream_that_held_it(smollm2_source, store, tmp_path):
    """Two engines, each stream in a worker process of its own (`--workers 2`), a 64-token prefix both cached: a row
    goes to the stream holding the most of its blocks; one whose blocks both hold as many goes to the stream its
    worker was told to be before, else to none (`ambiguous`); a row no stream holds, to none (`not_held`). A block
    two sessions named is the first's, on its own stream only."""
    ports = {name: free_port() for name in ("a", "b")}
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    trace = trace_dir / "dynamo-request-trace.jsonl"
    shared = _tokens(7, 64)  # 4 blocks: a system prompt every worker caches
    with (
        running_server(smollm2_source, options={"kv_events_endpoint": f"tcp://*:{ports['a']}"}) as a,
        running_server(smollm2_source, options={"kv_events_endpoint": f"tcp://*:{ports['b']}"}) as b,
    ):
        streams = [f"worker-{name}=tcp://127.0.0.1:{port}" for name, port in ports.items()]
        collector = Collector(CollectorOptions(kv_events=streams, dynamo_trace=str(trace_dir), workers=2), store=store)
        collector.start()
        try:
            time.sleep(1.0)  # (the workers' subscriptions reach the engines' PUB sockets)
            joins = collector.dynamo.join.outcomes
            on_a, on_b = Agent(a.url, trace), Agent(b.url, trace, worker=WORKER + 1)
            on_a.ask("alpha", shared + _tokens(8, 36))
            on_b.ask("beta", shared + _tokens(9, 36))
            on_a.flush()
            on_b.flush()
            wait_for(lambda: joins[TraceJoin.JOINED.value] == 2)
            on_a.ask("gamma", shared + _tokens(10, 6))  # both hold its 4 whole blocks: worker A's, told by alpha
            on_a.flush()
            on_b.ask("delta", shared + _tokens(11, 6))  # the same, from a worker never told apart
            on_b.pending[-1]["request"]["worker"] = {"decode_worker_id": 77}
            on_b.ask("epsilon", _tokens(12, 6))  # no whole block
            on_b.flush()
            wait_for(lambda: sum(joins.values()) == 5)
        finally:
            collector.stop()
    assert joins == {
        TraceJoin.JOINED.value: 3,
        TraceJoin.AMBIGUOUS.value: 1,
        TraceJoin.NOT_HELD.value: 1,
        TraceJoin.NO_BLOCKS.value: 0,
        TraceJoin.BLOCK_SIZE_DIFFERS.value: 0,
    }
    ok, words = {n: (ok, w) for n, ok, w in exposition_checks(generate_latest(collector.registry).decode())}[
        "(Dynamo rows joined with KV events)"
    ]
    assert not ok and words.startswith("3 requests joined to the stream that held their blocks; 1 whose blocks no KV")
    assert "; 1 held alike by several streams" in words
    instance = store.reads.requests().set_index("session_id")["instance"]
    assert instance.to_dict() == {
        "alpha": "worker-a",
        "beta": "worker-b",
        "gamma": "worker-a",
        "delta": "worker-77",  # (as the row names its worker: no stream is claimed for it)
        "epsilon": f"worker-{WORKER + 1}",
    }
    footprints = store.reads.session_footprints().set_index(["session_id", "instance"])["session_blocks"]
    # alpha's 100 + 2 tokens are 6 blocks of worker A, beta's of worker B (the shared 4 on each its own)
    assert footprints.get(("alpha", "worker-a")) == 6 and footprints.get(("beta", "worker-b")) == 6
    assert ("alpha", "worker-b") not in footprints and ("beta", "worker-a") not in footprints
    assert ("gamma", "worker-a") not in footprints or footprints[("gamma", "worker-a")] == 0  # (alpha's already)
