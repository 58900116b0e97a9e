"""A seeded fuzz of the OpenAI endpoints: random types, extreme numbers, huge strings and odd Unicode in every field.
Every answer is a 2xx or an OpenAI-shaped 4xx (never a 5xx, never a dropped connection), and afterwards /health is 200
and a plain request is answered. `KVOBS_FUZZ_REQUESTS` sets how many (300 by default; more by hand)."""

from __future__ import annotations

import json
import os
import random

import httpx
import pytest

from tests.server.conftest import SERVED, running_server

REQUESTS = int(os.environ.get("KVOBS_FUZZ_REQUESTS", "300"))
SEED = int(os.environ.get("KVOBS_FUZZ_SEED", "20261123"))
ODD_TEXT = [
    "",
    "hi",
    "\x00",
    "\ud800",
    "\udfff x",
    "e\u0301",
    "\u202eevil",
    "🦙" * 50,
    "\uffff",
    "a" * 20_000,
    "{}",
    "\\u0000",
    "\n" * 500,
    "Ω≈ç√",
    " ",
]
NUMBERS = [0, 1, -1, 2, 3, 0.5, -0.0, 1e-40, 1e-5, 1e308, -1e308, 2**31, 2**63, 2**70, -(2**70), 3.7, True, False]
FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "echo",
    "session_id",
    "ignore_eos",
    "presence_penalty",
    "user",
    "best_of",
]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.choice(["text", "number", "none", "list", "dict", "tokens"] if depth < 2 else ["text", "number"])
    if kind == "text":
        return rng.choice(ODD_TEXT)
    if kind == "number":
        return rng.choice(NUMBERS)
    if kind == "none":
        return None
    if kind == "tokens":
        return [rng.choice([1, 2, 50, 49151, 49152, -3, 10**9]) for _ in range(rng.randint(0, 5))]
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {
        rng.choice(["role", "content", "type", "text", "include_usage"]): _value(rng, depth + 1)
        for _ in range(rng.randint(0, 3))
    }


def _message(rng: random.Random):
    if rng.random() < 0.3:
        return _value(rng, 1)
    return {"role": rng.choice(["user", "system", "assistant", "tool", "wizard", 7]), "content": _value(rng, 1)}


def fuzz_body(rng: random.Random, chat: bool) -> dict:
    body = {"model": SERVED}
    for name in rng.sample(FIELDS, rng.randint(1, 8)):
        body[name] = _value(rng)
    if chat and rng.random() < 0.8:
        body["messages"] = [_message(rng) for _ in range(rng.randint(0, 3))]
    elif not chat and rng.random() < 0.8:
        body["prompt"] = rng.choice([rng.choice(ODD_TEXT), _value(rng)])
    body["max_tokens"] = rng.choice([1, 2, 3, 0, -5, "ten", 2**70, 10**12])  # never a long generation
    body.pop("max_completion_tokens", None) if rng.random() < 0.7 else None
    return body


def _check(r: httpx.Response, stream: bool) -> None:
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif stream and r.headers.get("content-type", "").startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.timeout(1800)
def test_fuzzed_requests_get_2xx_or_an_openai_4xx_and_the_server_stays_healthy(smollm2_source):
    rng = random.Random(SEED)
    with running_server(smollm2_source) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        for i in range(REQUESTS):
            chat = rng.random() < 0.5
            path = "/v1/chat/completions" if chat else "/v1/completions"
            body = fuzz_body(rng, chat)
            content = json.dumps(body, ensure_ascii=True)  # lone surrogates go as \\ud800 escapes, as JSON allows
            if rng.random() < 0.05:
                content = content[: rng.randint(0, len(content))]  # cut off
            r = client.post(path, content=content, headers={"content-type": "application/json"})
            _check(r, bool(body.get("stream")))
            if i % 50 == 0:
                assert client.get("/health").status_code == 200
        assert client.get("/health").status_code == 200
        ok = client.post("/v1/completions", json={"model": SERVED, "prompt": "Hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert server.engine.is_alive
