"""The reliability probe's server findings, each reproduced against a real server: bodies over the limit (F4), long
ids (F5), a lone surrogate (F13), an empty body (F16), a huge prompt that used to freeze every endpoint while it was
tokenized (F4), the admin endpoints' API key (F7), and requests in flight at shutdown (F14)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sqlalchemy import select

from kvobs.store import open_store
from kvobs.store.schema import RequestRow
from tests.server.conftest import SERVED, running_server
from tests.waiting import wait_for

COMPLETIONS = "/v1/completions"
LIMIT = 4 * 1024 * 1024
KEY = "test-key-7f3a"


@pytest.fixture(scope="module")
def guarded(smollm2_source):
    with running_server(smollm2_source, options={"max_request_bytes": LIMIT, "api_key": KEY}) as srv:
        yield srv


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def test_a_body_over_the_limit_is_413_whether_announced_or_streamed(guarded):
    big = b'{"prompt": "' + b"a" * (LIMIT + 10) + b'"}'
    announced = httpx.post(guarded.url + COMPLETIONS, content=big, headers={"content-type": "application/json"})

    def chunks():
        for i in range(0, len(big), 2**20):
            yield big[i : i + 2**20]

    streamed = httpx.post(guarded.url + COMPLETIONS, content=chunks(), headers={"content-type": "application/json"})
    assert "--max-request-bytes" in _error(announced, 413)["message"]
    assert "--max-request-bytes" in _error(streamed, 413)["message"]


@pytest.mark.parametrize(
    ("path", "body", "headers", "param"),
    [
        (COMPLETIONS, {"prompt": "hi", "session_id": "s" * 1_000_000}, {}, "session_id"),
        (COMPLETIONS, {"prompt": "hi"}, {"X-Session-ID": "h" * 300}, "X-Session-ID"),
        (f"/v1/kvobs/sessions/{'r' * 300}/release", None, {"Authorization": f"Bearer {KEY}"}, "session_id"),
        (
            "/v1/kvobs/invalidate",
            {"reason": "weights_update", "adapter": "a" * 300},
            {"Authorization": f"Bearer {KEY}"},
            "adapter",
        ),
    ],
)
def test_ids_longer_than_the_store_holds_are_400(guarded, path, body, headers, param):
    r = httpx.post(guarded.url + path, json=body, headers=headers, timeout=60)
    assert _error(r, 400)["param"] == param


def test_a_lone_surrogate_and_an_empty_body_are_400_in_openai_shape(guarded):
    surrogate = httpx.post(
        guarded.url + COMPLETIONS,
        content=b'{"prompt": "\\ud800abc", "max_tokens": 2}',
        headers={"content-type": "application/json"},
    )
    chat_body = b'{"messages": [{"role": "user", "content": "x\\udfffy"}], "max_tokens": 2}'
    chat = httpx.post(
        guarded.url + "/v1/chat/completions", content=chat_body, headers={"content-type": "application/json"}
    )
    empty = httpx.post(guarded.url + COMPLETIONS, content=b"", headers={"content-type": "application/json"})
    assert _error(surrogate, 400)["param"] == "prompt" and _error(chat, 400)["param"] == "messages"
    assert "empty" in _error(empty, 400)["message"] and "None" not in _error(empty, 400)["message"]


def test_health_answers_while_a_huge_prompt_is_tokenized(guarded):
    """Tokenizing ~3 MB takes seconds; on the event loop it froze /health for all of them."""
    done = threading.Event()

    def huge() -> httpx.Response:
        try:
            return httpx.post(guarded.url + COMPLETIONS, json={"prompt": "word " * 600_000}, timeout=120)
        finally:
            done.set()

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(huge)
        health_before_done = 0
        while not done.is_set():
            if httpx.get(guarded.url + "/health", timeout=120).status_code == 200 and not done.is_set():
                health_before_done += 1
        big = future.result()
    assert _error(big, 400)["code"] == "context_length_exceeded"
    assert health_before_done >= 2


def test_admin_endpoints_need_the_api_key_and_the_openai_api_does_not(guarded):
    refused = httpx.post(guarded.url + "/reset_prefix_cache")
    wrong = httpx.post(guarded.url + "/reset_prefix_cache", headers={"Authorization": "Bearer nope"})
    ok = httpx.post(guarded.url + "/reset_prefix_cache", headers={"Authorization": f"Bearer {KEY}"})
    served = httpx.post(guarded.url + COMPLETIONS, json={"model": SERVED, "prompt": "Hi", "max_tokens": 1})
    assert _error(refused, 401)["code"] == _error(wrong, 401)["code"] == "invalid_api_key"
    assert ok.status_code == 200 and served.status_code == 200


def test_requests_in_flight_at_shutdown_get_503_and_an_abort_row(smollm2_source, tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    long = {
        "model": SERVED,
        "prompt": "Write a very long story about a lighthouse.",
        "max_tokens": 480,
        "ignore_eos": True,
        "temperature": 0,
    }
    with running_server(smollm2_source, options={"store_url": url}) as server, ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(httpx.post, server.url + COMPLETIONS, json=long, timeout=60) for _ in range(6)]
        wait_for(lambda: len(server.engine.engine.sequences) == 6, timeout_s=30)
        server.shutdown()
        answers = [f.result() for f in futures]
    for r in answers:
        assert _error(r, 503)["code"] == "server_shutting_down"
    store = open_store(url)
    with store.session() as s:
        reasons = list(s.scalars(select(RequestRow.finish_reason)))
    store.close()
    assert reasons.count("abort") == 6


def test_a_request_whose_sampling_raises_fails_alone_and_the_engine_keeps_stepping(smollm2_source, monkeypatch):
    """The issue's High finding, in general: any exception from one request's sampling (here a fault injected into
    the sampler for requests with seed 666) fails that request alone, 500 to its client, blocks freed; the requests
    beside it in the same batches finish, and the engine goes on."""
    from instrumented_engine.layers import sampler

    real = sampler._sample_row

    def faulty(logits, sp, generator):
        if sp.seed == 666:
            raise RuntimeError("injected sampling fault")
        return real(logits, sp, generator)

    monkeypatch.setattr(sampler, "_sample_row", faulty)
    body = {
        "model": SERVED,
        "prompt": "Tell me about lighthouses.",
        "max_tokens": 24,
        "temperature": 0.8,
        "ignore_eos": True,
    }
    with running_server(smollm2_source) as server, ThreadPoolExecutor(4) as pool:
        seeds = [1, 666, 2, 3]
        answers = list(
            pool.map(lambda seed: httpx.post(server.url + COMPLETIONS, json={**body, "seed": seed}, timeout=120), seeds)
        )
        stream = httpx.post(server.url + COMPLETIONS, json={**body, "seed": 666, "stream": True}, timeout=120)
        engine = server.engine.engine
        wait_for(lambda: not engine.has_unfinished_requests())
        free, usable = engine.block_manager.num_free_blocks, engine.block_manager.num_usable_blocks
        healthy = httpx.get(server.url + "/health").status_code
    failed = answers[1]
    assert _error(failed, 500)["code"] == "request_failed"
    assert [a.json()["usage"]["completion_tokens"] for i, a in enumerate(answers) if i != 1] == [24, 24, 24]
    assert '"code": "request_failed"' in stream.text and stream.text.rstrip().endswith("data: [DONE]")
    assert free == usable and healthy == 200
