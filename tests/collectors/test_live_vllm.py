"""Optional: the collector against a live vLLM (CPU build) started with scripts/vllm-cpu.sh.

Run with `KVOBS_TEST_VLLM=1 KVOBS_VLLM_VENV=/path/to/venv pytest tests/collectors/test_live_vllm.py` after
`bash scripts/vllm-cpu.sh setup /path/to/venv` (about 5 minutes, 3 GB). Not part of CI: it needs that
setup; the recorded run (test_collector_recorded.py) covers the same paths on every commit.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from sqlalchemy import func, select

from collectors.collector import Collector, CollectorOptions
from instrumented_engine.whatif.replay import ReplayPlan
from kvobs.analytics.steps.attribution import attribute_steps
from kvobs.store.schema import KVEventRow, RequestRow, SnapshotRow
from tests.collectors.agent_harness import FIXTURES, Harness, record_fixture
from tests.server.conftest import free_port
from tests.waiting import wait_for

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm-cpu.sh"

pytestmark = pytest.mark.skipif(
    os.environ.get("KVOBS_TEST_VLLM") != "1", reason="live vLLM test: set KVOBS_TEST_VLLM=1 and KVOBS_VLLM_VENV"
)


def test_collector_on_a_live_vllm(store):
    port, kv, otlp = free_port(), free_port(), free_port()
    collector = Collector(
        CollectorOptions(
            vllm_urls=[f"vllm=http://127.0.0.1:{port}"],
            kv_events=[f"tcp://127.0.0.1:{kv}"],
            kv_events_bind=True,
            otlp_http=f"127.0.0.1:{otlp}",
            interval_s=1.0,
        ),
        store=store,
    )
    collector.start()
    vllm = _serve(port, kv, otlp, "--num-gpu-blocks-override", "16")
    try:
        _wait_started(vllm, port)
        system = "You are a meticulous research agent. " * 100  # ~6 blocks of 128 tokens per session
        for session in ("live-a", "live-b", "live-c"):
            body = {
                "model": "smollm2",
                "max_tokens": 8,
                "messages": [{"role": "system", "content": session + system}, {"role": "user", "content": "Go."}],
            }
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body,
                headers={"X-Session-ID": session},
                timeout=300,
            )
            assert r.status_code == 200, r.text
        wait_for(lambda: collector.span_ingest.num_requests >= 3, timeout_s=60)
        time.sleep(2)
    finally:
        vllm.terminate()
        vllm.wait(60)
        collector.stop()
    with store.session() as s:
        stored = set(s.scalars(select(KVEventRow.session_id).where(KVEventRow.kind == "stored")))
        removed = s.scalar(select(func.count()).select_from(KVEventRow).where(KVEventRow.kind == "removed"))
        requests = s.scalar(select(func.count()).select_from(RequestRow))
        snapshots = s.scalar(select(func.count()).select_from(SnapshotRow).where(SnapshotRow.session_id.is_(None)))
    assert {"live-a", "live-b", "live-c"} <= stored and removed > 0  # 16 blocks: the sessions evict each other
    assert requests >= 3 and snapshots > 0


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _serve(port: int, kv: int, otlp: int, *args: str) -> subprocess.Popen:
    """`vllm-cpu.sh serve` on `port` with `args`, publishing its KV events (topic `kv`) to the ZMQ endpoint `kv`
    (vLLM connects to it) and exporting its spans to the OTLP/HTTP receiver on `otlp`."""
    kv_config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{kv}", "topic": "kv"}
    command = ["bash", str(SCRIPT), "serve", os.environ["KVOBS_VLLM_VENV"], str(port), *args]
    command += [
        "--kv-events-config",
        json.dumps(kv_config),
        "--otlp-traces-endpoint",
        f"http://127.0.0.1:{otlp}/v1/traces",
    ]
    return subprocess.Popen(command, env={**os.environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})


def _wait_started(vllm: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + 600
    while not _healthy(port):
        assert vllm.poll() is None and time.monotonic() < deadline, "vLLM did not start"
        time.sleep(2)


@contextmanager
def _relayed_vllm(store, max_model_len: str) -> Iterator[tuple[Harness, Collector, list, int]]:
    """A vLLM of 16 blocks sending prompt-token details, its KV-event stream through a relay that records it
    (`frames`) to a collector whose harness keeps every OTLP export; yields (harness, collector, frames, port), all
    stopped after."""
    from tests.recording import relay

    port, kv, onward, otlp = free_port(), free_port(), free_port(), free_port()
    frames: list = []
    stop = threading.Event()
    tap = threading.Thread(target=relay, args=(f"tcp://127.0.0.1:{kv}", f"tcp://127.0.0.1:{onward}", frames, stop))
    tap.start()
    collector = Collector(
        CollectorOptions(
            vllm_urls=[f"vllm=http://127.0.0.1:{port}"],
            kv_events=[f"vllm=tcp://127.0.0.1:{onward}"],
            kv_events_topic="kv",
            otlp_http=f"127.0.0.1:{otlp}",
            interval_s=1.0,
            settle_s=2.0,
        ),
        store=store,
    )
    harness = _recording(collector, port, otlp, "langchain")
    collector.start()
    vllm = _serve(
        port,
        kv,
        otlp,
        "--num-gpu-blocks-override",
        "16",
        "--max-model-len",
        max_model_len,
        "--enable-prompt-tokens-details",
    )
    try:
        _wait_started(vllm, port)
        yield harness, collector, frames, port
    finally:
        vllm.terminate()
        vllm.wait(60)
        collector.stop()
        stop.set()


def _tenant(port: int, done: threading.Event) -> int:
    """Another tenant of the replica: a prompt of fourteen blocks of its own every 3 s until `done` (each new: it
    takes the whole cache but what running requests hold); returns how many it sent."""
    sent = 0
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        while not done.wait(3.0):
            words = f"tenant call {sent}: " + "unrelated filler text for another customer " * 240
            body = {"model": "smollm2", "max_tokens": 1, "messages": [{"role": "user", "content": words}]}
            assert client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "tenant"}).is_success
            sent += 1
    return sent


def _recording(collector: Collector, port: int, otlp: int, service: str) -> Harness:
    """A harness over the live vLLM on `port` whose collector keeps every OTLP export it takes (for fixtures)."""
    harness = Harness(
        SimpleNamespace(url=f"http://127.0.0.1:{port}"), collector, f"http://127.0.0.1:{otlp}/v1/traces", service
    )
    receive = collector.receiver.handle
    collector.receiver.handle = lambda request: harness.bodies.append(request.SerializeToString()) or receive(request)
    return harness


def test_agents_traced_by_their_frameworks_on_a_live_vllm(store):
    """An OpenInference agent (one conversation with the session header, one without, one call refused as too
    long) and a pydantic-ai agent against vLLM through the collector: vLLM's `llm_request` span names the id it
    answered (`gen_ai.request.id`), so every answered step is joined to its vLLM request by that id, without
    trace context. With KVOBS_RECORD_AGENT_FIXTURES=1 the exports become tests/fixtures/agents/vllm-*."""
    port, kv, otlp = free_port(), free_port(), free_port()
    collector = Collector(
        CollectorOptions(
            vllm_urls=[f"vllm=http://127.0.0.1:{port}"],
            kv_events=[f"tcp://127.0.0.1:{kv}"],
            kv_events_bind=True,
            kv_events_topic="kv",
            otlp_http=f"127.0.0.1:{otlp}",
            interval_s=1.0,
            settle_s=2.0,
        ),
        store=store,
    )
    harness = _recording(collector, port, otlp, "travel-agent")
    collector.start()
    vllm = _serve(
        port, kv, otlp, "--num-gpu-blocks-override", "24", "--max-model-len", "1024", "--enable-prompt-tokens-details"
    )
    try:
        _wait_started(vllm, port)
        oi = harness.agent(
            "openinference", conversations={"with-header": "session", "without": None}, too_long="without"
        )["answered"]
        harness.service = "pydantic-agent"
        pai = harness.agent("pydantic_ai")["answered"]
        wait_for(lambda: collector.span_ingest.num_requests >= harness.served, timeout_s=60)
        time.sleep(3)
    finally:
        vllm.terminate()
        vllm.wait(60)
        collector.stop()
    answered = {**oi, **pai}
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert set(steps["session_id"]) == set(answered)
    ok = steps[steps["status"] == "ok"]
    assert ok.groupby("session_id")["response_id"].apply(list).to_dict() == answered
    failed = steps[steps["status"] == "error"]
    assert failed[["session_id", "error_type"]].values.tolist() == [["without", "400"]]
    requests = store.reads.requests()
    assert set(ok["response_id"]) <= set(requests["request_id"])  # vLLM's gen_ai.request.id is the id it answered
    verdicts = attribute_steps(steps, requests, store.reads.kv_events()).set_index(["session_id", "step_index"])
    assert verdicts["num_requests"].to_dict() == {
        (s, i): int(st == "ok") for s, i, st in zip(steps["session_id"], steps["step_index"], steps["status"])
    }
    owners = set(store.reads.kv_events(kinds=["stored"])["session_id"].dropna())
    assert "with-header" in owners and "without" not in owners  # KV events name a session only from the header
    if os.environ.get("KVOBS_RECORD_AGENT_FIXTURES") == "1":
        record_fixture(FIXTURES / "vllm-openinference-pydantic-ai", harness.bodies, store)


def test_framework_agents_on_a_live_vllm_own_their_blocks_by_inference_as_by_header(store):
    """LangChain and the OpenAI Agents SDK at once, three conversations each (names of different lengths), sending
    the session header, on a vLLM whose cache is too small for them: every answered step is joined to its request,
    and the recording (with vLLM's KV-event messages) is what `test_agent_kv_fixtures.py` replays with the header's
    names taken away, to be held to the losses the header gave each session here."""
    from tests.collectors.test_agent_kv_fixtures import header_truth, losses
    from tests.collectors.test_agent_ownership import CONVERSATIONS

    with _relayed_vllm(store, "1536") as (harness, collector, frames, port):
        # prompts of 3 to 5 blocks of 128 tokens, tools of 2.4 to 3.6 s (a CPU vLLM's requests take seconds)
        long = {"concurrent": True, "header": True, "repeat": 12, "tool_scale": 8}
        sdk = [f"sdk-{name}" for name in CONVERSATIONS]
        with ThreadPoolExecutor(2) as pool:  # both agents at once: six conversations share the cache
            runs = [pool.submit(harness.agent, "langchain", conversations=CONVERSATIONS, **long)]
            runs.append(pool.submit(harness.agent, "openai_agents", conversations=sdk, **long))
        answered = runs[0].result()["answered"] | runs[1].result()["answered"]
        wait_for(lambda: collector.span_ingest.num_requests >= harness.served, timeout_s=60)
        time.sleep(3)
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id")["request_id"].apply(list).to_dict() == answered  # every step joined
    assert set(steps["request_join"]) <= {"response_id", "timing"}
    named = set(store.reads.kv_events(kinds=["stored"])["session_id"].dropna())
    assert named == set(answered)  # the header named every session's blocks
    sessions = header_truth(store, sorted(answered))  # where the header's names place each loss
    assert sum(s["lost_in_pause"] for s in sessions.values()) > 0, sessions  # tool pauses lost blocks
    assert losses(store, sorted(answered)) == sessions  # and the live collector counted them so
    if os.environ.get("KVOBS_RECORD_AGENT_FIXTURES") == "1":
        record = FIXTURES / "vllm-frameworks-kv"
        record_fixture(record, harness.bodies, store, frames)
        truth = {"header": True, "requests_tied": None, "sessions": sessions}
        (record / "kv_truth.json").write_text(json.dumps(truth, indent=1) + "\n")


def test_six_overlapping_sessions_on_a_live_vllm_own_their_blocks_by_inference_as_by_header(store):
    """Six LangChain conversations at once (`SIX`: names 20 or more characters apart), one system prompt of three
    blocks, sending the session header, on a vLLM of 16 blocks, with another tenant's long prompts every 3 s: the
    conversations' requests overlap on one replica, the system prompt's blocks are stored by one and found by the
    rest, and evicted while all six wait on their tools. vLLM names the storer's session on every `BlockStored`, so
    the header's names place each loss (a shared block's is its storer's); the recording (with vLLM's KV-event
    messages) is what `test_agent_kv_fixtures.py` replays with the names taken away, where ownership by inference
    must come to the same losses. Recorded by `KVOBS_TEST_VLLM=1 KVOBS_VLLM_VENV=DIR KVOBS_RECORD_AGENT_FIXTURES=1
    pytest tests/collectors/test_live_vllm.py -k six_overlapping`."""
    from tests.collectors.test_agent_kv_fixtures import header_truth, losses
    from tests.collectors.test_agent_ownership import SIX

    with _relayed_vllm(store, "1920") as (harness, collector, frames, port):
        # a system prompt of three blocks of 128 tokens that all share (the usual one is shorter than a block)
        run = {"concurrent": True, "header": True, "repeat": 12, "tool_scale": 30, "system_repeat": 5}
        with ThreadPoolExecutor(1) as pool:  # and another tenant's long prompts, to evict it in the agents' pauses
            done = threading.Event()
            tenant = pool.submit(_tenant, port, done)
            try:
                answered = harness.agent("langchain", conversations=SIX, **run)["answered"]
            finally:
                done.set()
            assert tenant.result() > 0
        wait_for(lambda: collector.span_ingest.num_requests >= harness.served, timeout_s=60)
        time.sleep(3)
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id")["request_id"].apply(list).to_dict() == answered  # every step joined
    requests = store.reads.requests().sort_values("arrival_ts")
    overlapping = (requests["arrival_ts"].values[1:] < requests["finished_ts"].cummax().values[:-1]).sum()
    assert overlapping >= len(requests) // 2  # the sessions' requests overlapped on the replica
    named = set(store.reads.kv_events(kinds=["stored"])["session_id"].dropna())
    assert named == {*answered, "tenant"}  # the header named every session's blocks (and the tenant's)
    sessions = header_truth(store, sorted(answered))  # where the header's names place each loss
    assert sum(s["lost_in_pause"] for s in sessions.values()) > 0, sessions  # tool pauses lost blocks
    assert losses(store, sorted(answered)) == sessions  # and the live collector counted them so
    if os.environ.get("KVOBS_RECORD_AGENT_FIXTURES") == "1":
        record = FIXTURES / "vllm-six-sessions-kv"
        record_fixture(record, harness.bodies, store, frames)
        truth = {"header": True, "requests_tied": None, "sessions": sessions}
        (record / "kv_truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    plan = ReplayPlan.from_store(store)
    users = {h: {r.session_id for r in plan.requests if h in r.chain} for r in plan.requests for h in r.chain}
    removed = store.reads.kv_events(kinds=["removed"])
    assert any(len(users.get(int(h), ())) == 6 for h in removed["block_hash"])  # the shared prompt was evicted
