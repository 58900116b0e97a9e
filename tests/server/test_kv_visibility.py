"""What the cache did, seen from outside: /metrics (vLLM names + kvobs_*) and the vLLM-format event stream."""

from __future__ import annotations

import httpx
import zmq

from kvobs.vllm import kv_events as wire
from tests.server.conftest import SERVED, receive_events, scrape

SYSTEM = "You are a careful assistant for an airline. Answer questions about baggage, seats and delays. " * 8


def chat(url: str, question: str, session: str, **extra) -> dict:
    body = {
        "model": SERVED,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 3,
        "temperature": 0,
        **extra,
    }
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Session-ID": session}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def delta(after: dict, before: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_shared_system_prompt_shows_hits_in_metrics_and_events(server, subscriber):
    before = scrape(server.url)
    first = chat(server.url, "Can I bring a bike?", "vis-a")
    second = chat(server.url, "Is there wifi on board?", "vis-b")
    after = scrape(server.url)
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 128 and cached % 16 == 0 and first["usage"]["prompt_tokens_details"]["cached_tokens"] <= cached
    prompt_tokens = first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    assert delta(after, before, "vllm:prefix_cache_queries_total") == prompt_tokens
    assert (
        delta(after, before, "vllm:prefix_cache_hits_total")
        == first["usage"]["prompt_tokens_details"]["cached_tokens"] + cached
    )
    assert delta(after, before, "vllm:request_success_total", finished_reason="length") == 2

    stored = [e for _, e in receive_events(subscriber) if isinstance(e, wire.BlockStored)]
    by_session = {s: [e for e in stored if e.session_id == s] for s in ("vis-a", "vis-b")}
    a_hashes = {h for e in by_session["vis-a"] for h in e.block_hashes}
    # vis-b hit the shared blocks, so what it stored is chained onto vis-a's system-prompt blocks
    assert by_session["vis-b"] and by_session["vis-b"][0].parent_block_hash in a_hashes
    assert all(e.block_size == 16 and len(e.token_ids) == 16 * len(e.block_hashes) for e in stored)
    assert all(h >= 0 for e in stored for h in e.block_hashes)


def test_forced_eviction_shows_block_removed_and_capacity_counter(server, subscriber):
    before = scrape(server.url)
    for i in range(8):  # ~8 x 150 distinct tokens after the shared system prompt through a 95-block (1,520-token) cache
        chat(server.url, f"Trip {i}: " + " ".join(f"city{i}x{j}" for j in range(40)), f"evict-{i}")
    after = scrape(server.url)
    events = [e for _, e in receive_events(subscriber)]
    removed = [h for e in events if isinstance(e, wire.BlockRemoved) for h in e.block_hashes]
    assert removed, "a cache this small must evict"
    assert delta(after, before, "kvobs_kv_blocks_evicted_total", reason="capacity") == len(removed)
    assert delta(after, before, "vllm:kv_block_lifetime_seconds_count") == len(removed)
    total = after[("kvobs_kv_cache_total_blocks", ())]
    assert total == 95 and after[("kvobs_kv_cache_free_blocks", ())] == total  # idle: nothing pinned
    assert after[("vllm:kv_cache_usage_perc", ())] == 0.0
    assert 0 < after[("kvobs_kv_cache_resident_blocks", ())] <= total


def test_replay_returns_what_was_published(server, subscriber, kv_ports):
    chat(server.url, "Where is my bag?", "replay-s")
    live = receive_events(subscriber)
    first_seq = live[0][0]
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.connect(f"tcp://127.0.0.1:{kv_ports[1]}")
    try:
        dealer.send_multipart([wire.seq_bytes(first_seq)])
        replayed = []
        while True:
            topic, seq, payload = dealer.recv_multipart()
            if seq == wire.REPLAY_END:
                break
            assert topic == b"kv"
            replayed.extend((wire.seq_from_bytes(seq), e) for e in wire.decode_batch(payload)[0].events)
    finally:
        dealer.close(0)
    assert replayed[: len(live)] == live


def test_admin_reset_invalidate_and_release(server, subscriber):
    chat(server.url, "Seat upgrade?", "adm-1")
    receive_events(subscriber)
    before = scrape(server.url)
    r = httpx.post(server.url + "/v1/kvobs/invalidate", json={"reason": "session_forget", "session_id": "adm-1"})
    assert r.status_code == 200 and r.json()["num_blocks"] > 0 and "adm-1" in r.json()["sessions_affected"]
    after = scrape(server.url)
    forgot = r.json()["num_blocks"]
    assert delta(after, before, "kvobs_kv_blocks_invalidated_total", reason="session_forget") == forgot
    assert delta(after, before, "kvobs_kv_blocks_evicted_total", reason="invalidation") == forgot
    removed = [e for _, e in receive_events(subscriber) if isinstance(e, wire.BlockRemoved)]
    assert len(removed) == forgot

    chat(server.url, "Meal options?", "adm-2")
    released = httpx.post(server.url + "/v1/kvobs/sessions/adm-2/release").json()
    assert released["session_id"] == "adm-2" and released["num_blocks_released"] >= 1

    assert httpx.post(server.url + "/reset_prefix_cache").json() == {"success": True}
    events = [e for _, e in receive_events(subscriber)]
    assert isinstance(events[-1], wire.AllBlocksCleared)
    again = chat(server.url, "Meal options?", "adm-3")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_session_id_from_the_body_reaches_the_events(server, subscriber):
    receive_events(subscriber)  # what earlier tests' last requests published is not this test's
    chat(server.url, "Pets in the cabin?", "ignored-header-less", session_id="body-sess")
    stored = [e for _, e in receive_events(subscriber) if isinstance(e, wire.BlockStored)]
    assert stored and {e.session_id for e in stored} == {"ignored-header-less"}  # the header wins
    body = {
        "model": SERVED,
        "messages": [{"role": "system", "content": SYSTEM + " Be terse."}, {"role": "user", "content": "Pets?"}],
        "max_tokens": 2,
        "session_id": "body-sess",
    }
    assert httpx.post(server.url + "/v1/chat/completions", json=body).status_code == 200
    stored = [e for _, e in receive_events(subscriber) if isinstance(e, wire.BlockStored)]
    assert stored and {e.session_id for e in stored} == {"body-sess"}
