"""The OpenAI API on a real uvicorn server, through the official `openai` client and plain httpx."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server.conftest import SERVED

SYSTEM = (
    "You are a travel agent. You plan city trips with care: museums, food, walks, and how to get around. "
    "Answer briefly and concretely, one suggestion per line, and never invent opening hours. " * 2
)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def test_models_and_health(server, client):
    (card,) = client.models.list().data
    assert card.id == SERVED and card.owned_by == "kvobs"
    assert httpx.get(server.url + "/health").status_code == 200


def test_chat_answers_from_the_model_with_usage(client):
    reply = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content and reply.choices[0].message.role == "assistant"
    assert reply.object == "chat.completion" and reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 10 and 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_completion_equals_the_plain_one(client):
    kwargs = dict(model=SERVED, prompt="The three largest cities of Italy are", max_tokens=24, temperature=0)
    plain = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text and len(text) > 0
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_streamed_chat_with_stop_string_equals_the_plain_one(client):
    kwargs = dict(
        model=SERVED,
        messages=[{"role": "user", "content": "Count from 1 to 10, comma separated."}],
        max_tokens=40,
        temperature=0,
        stop=["5"],
    )
    plain = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.message.content and "5" not in text and plain.finish_reason == "stop"


def test_raw_sse_ends_with_done(server):
    body = {"model": SERVED, "prompt": "Hello", "max_tokens": 3, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_shared_system_prompt_hits_the_prefix_cache(client):
    def ask(question: str, session: str):
        return client.chat.completions.create(
            model=SERVED,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
            extra_headers={"X-Session-ID": session},
        )

    first = ask("A day in Rome?", "trip-a")
    second = ask("A day in Lisbon?", "trip-b")
    block_size = 16
    shared = first.usage.prompt_tokens - 12  # the system prompt and template make up most of the prompt
    assert second.usage.prompt_tokens_details.cached_tokens >= (shared // block_size - 1) * block_size
    assert second.usage.prompt_tokens_details.cached_tokens % block_size == 0


def test_session_id_body_field_is_accepted(server):
    body = {"model": SERVED, "prompt": "Hi", "max_tokens": 2, "session_id": "body-session"}
    assert httpx.post(server.url + "/v1/completions", json=body).status_code == 200
