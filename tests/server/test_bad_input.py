"""Bad requests get OpenAI's error shape and status, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import SERVED

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"),
    [
        (COMPLETIONS, b"{not json", 400, None, None),
        (COMPLETIONS, b"[1, 2]", 400, None, None),
        (COMPLETIONS, {"model": SERVED}, 400, "prompt", None),
        (CHAT, {"model": SERVED}, 400, "messages", None),
        (CHAT, {"model": SERVED, "messages": []}, 400, "messages", None),
        (CHAT, {"model": SERVED, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", None),
        (COMPLETIONS, {"model": SERVED, "prompt": 42}, 400, "prompt", None),
        (COMPLETIONS, {"model": "gpt-9", "prompt": "hi"}, 404, "model", "model_not_found"),
        (COMPLETIONS, {"model": SERVED, "prompt": "hi " * 600}, 400, "prompt", "context_length_exceeded"),
        (
            CHAT,
            {"model": SERVED, "messages": [{"role": "user", "content": "hi " * 600}]},
            400,
            "messages",
            "context_length_exceeded",
        ),
        (COMPLETIONS, {"model": SERVED, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens", None),
        (
            COMPLETIONS,
            {"model": SERVED, "prompt": "hi", "max_tokens": 600},
            400,
            "max_tokens",
            "context_length_exceeded",
        ),
        (COMPLETIONS, {"model": SERVED, "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens", None),
        (CHAT, {"model": SERVED, "messages": MSG, "n": 2}, 400, "n", None),
        (CHAT, {"model": SERVED, "messages": MSG, "temperature": -0.5}, 400, "temperature", None),
        (COMPLETIONS, {"model": SERVED, "prompt": ["a", "b"]}, 400, "prompt", None),
        (COMPLETIONS, {"model": SERVED, "prompt": [999999999]}, 400, None, None),
        (
            CHAT,
            {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages",
            None,
        ),
        ("/v1/kvobs/invalidate", {"reason": "bogus"}, 400, "reason", None),
        ("/v1/kvobs/invalidate", {"reason": "session_forget"}, 400, "reason", None),
        ("/v1/nothing-here", {}, 404, None, None),
    ],
)
def test_bad_request_gets_openai_error_shape(server, path, body, status, param, code):
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    r = httpx.post(server.url + path, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    assert (error["param"], error["code"]) == (param, code)
    ok = httpx.post(server.url + COMPLETIONS, json={"model": SERVED, "prompt": "Hi", "max_tokens": 1})
    assert ok.status_code == 200  # still serving


def test_context_error_is_stated_in_tokens(server):
    r = httpx.post(server.url + COMPLETIONS, json={"model": SERVED, "prompt": "hi", "max_tokens": 600})
    assert "maximum context length is 512 tokens" in r.json()["error"]["message"]
    assert "lower max_tokens to at most" in r.json()["error"]["message"]


@pytest.mark.parametrize("temperature", [1e-40, 1e-7, 5e-324])
def test_a_tiny_temperature_is_greedy_and_never_stops_the_engine(server, temperature):
    """Reliability probe F1: temperature 1e-40 passed validation, `logits / temperature` overflowed and
    `torch.multinomial` raised on the engine thread: every later request got 503. Below vLLM's epsilon it is greedy."""
    body = {"model": SERVED, "prompt": "The capital of France is", "max_tokens": 4}
    r = httpx.post(server.url + COMPLETIONS, json={**body, "temperature": temperature}, timeout=60)
    assert r.status_code == 200, r.text
    greedy = httpx.post(server.url + COMPLETIONS, json={**body, "temperature": 0}, timeout=60)
    assert r.json()["choices"][0]["text"] == greedy.json()["choices"][0]["text"]
    assert httpx.get(server.url + "/health").status_code == 200
