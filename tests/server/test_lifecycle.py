"""Request lifecycle under a real server: disconnects abort, a full queue answers 429, bursts drain."""

from __future__ import annotations

import asyncio
import gc
import os
import weakref

import httpx
import pytest

from tests.server.conftest import SERVED, running_server, scrape
from tests.waiting import wait_for

LONG = {
    "model": SERVED,
    "prompt": "Write a very long story about a lighthouse.",
    "max_tokens": 400,
    "ignore_eos": True,
    "temperature": 0,
}


def assert_idle(server) -> None:
    """Nothing left behind: no sequence, no stream, every block free (cached ones stay resident)."""
    engine = server.engine.engine
    wait_for(lambda: not engine.has_unfinished_requests())
    assert engine.sequences == {} and server.engine._requests == {}
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks
    assert server.metrics._last_token_ts == {}


def aborted(url: str) -> float:
    return scrape(url).get(("vllm:request_success_total", (("finished_reason", "abort"),)), 0.0)


def test_disconnect_during_stream_aborts_and_frees_blocks(server):
    before = aborted(server.url)
    with httpx.stream("POST", server.url + "/v1/completions", json={**LONG, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # generation has begun; now hang up
    wait_for(lambda: aborted(server.url) == before + 1)
    assert_idle(server)


def test_disconnect_while_waiting_for_a_plain_response_aborts(server):
    before = aborted(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=LONG, timeout=1.0)
    wait_for(lambda: aborted(server.url) == before + 1)
    assert_idle(server)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def burst(url: str, n: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        body = {"model": SERVED, "max_tokens": 2, "temperature": 0}
        tasks = [client.post("/v1/completions", json={**body, "prompt": f"Request {i} says"}) for i in range(n)]
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)


def test_burst_of_200_completes_or_gets_429_and_drains(smollm2_source):
    with running_server(smollm2_source, options={"max_waiting": 24}, max_num_seqs=16) as server:
        asyncio.run(burst(server.url, 200))  # warm-up: allocator pools, sockets, caches
        assert_idle(server)
        baseline = rss_bytes()
        rejected_key = ("kvobs_requests_rejected_total", (("reason", "queue_full"),))
        rejected_before = scrape(server.url)[rejected_key]
        responses = asyncio.run(burst(server.url, 200))
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 429} and codes.count(200) >= 24 and codes.count(429) >= 1
        rejected = next(r for r in responses if r.status_code == 429)
        assert rejected.json()["error"]["type"] == "rate_limit_error" and rejected.headers["retry-after"] == "1"
        assert all(r.json()["usage"]["completion_tokens"] == 2 for r in responses if r.status_code == 200)
        assert_idle(server)
        assert scrape(server.url)[rejected_key] - rejected_before == codes.count(429)
        assert rss_bytes() - baseline < 64 * 2**20  # memory back to where the first burst left it


class _FatalEngineError(BaseException):
    """A failure the engine loop cannot recover from (BaseException: not a request's own error)."""


def test_dead_engine_loop_makes_health_503_and_requests_fail_cleanly(smollm2_source):
    with running_server(smollm2_source) as server:

        def crash(_engine):
            raise _FatalEngineError("simulated fatal engine failure")

        with pytest.raises(Exception):  # noqa: B017  (the caller sees the loop stop: dead-engine error)
            asyncio.run(asyncio.wait_for(server.engine.call(crash), timeout=10))
        wait_for(lambda: not server.engine.is_alive)
        assert httpx.get(server.url + "/health").status_code == 503
        r = httpx.post(server.url + "/v1/completions", json={"model": SERVED, "prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"


def test_a_shut_down_server_leaves_its_engine_to_be_freed(smollm2_source):
    """Nothing outside a server keeps its engine (weights copy and KV cache, about 0.7 GB here): FastAPI caches
    endpoint functions process-wide, so routes must not close over the engine; a process that builds servers one
    after another (the test suite) otherwise grows until it is killed."""
    engines = []
    for _ in range(2):
        with running_server(smollm2_source, num_blocks=48) as server:
            body = {"model": SERVED, "prompt": "Hello", "max_tokens": 2}
            assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
            assert httpx.get(server.url + "/v1/models", timeout=10).status_code == 200
            engines.append(weakref.ref(server.engine.engine))
        del server
    gc.collect()
    assert [engine() for engine in engines] == [None, None]
