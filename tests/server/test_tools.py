"""Tool calling and structured output on `kvobs serve`, through the official OpenAI client: tools reach the
prompt, the model's tool-call syntax comes back as `tool_calls`, a tool's result goes back with its
`tool_call_id`, and `tool_choice` required / named and `response_format` JSON are held to a grammar (xgrammar), so
SmolLM2-135M answers with valid calls and JSON."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from instrumented_engine.server.tools import parse_tool_calls, prompt_messages
from tests.server.conftest import SERVED

FLIGHTS = {
    "type": "function",
    "function": {
        "name": "search_flights",
        "description": "Search flights to a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "max_price": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
HOTEL = {
    "type": "function",
    "function": {
        "name": "book_hotel",
        "description": "Book a hotel",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}},
            "required": ["city", "nights"],
        },
    },
}
TOOLS = [FLIGHTS, HOTEL]
ASK = [{"role": "user", "content": "Find me a flight to Lisbon under 300 euros."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _arguments(call) -> dict:
    return json.loads(call.function.arguments)


def test_required_tool_choice_returns_a_valid_call_of_an_offered_tool(client):
    reply = client.chat.completions.create(
        model=SERVED, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    spec = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.function.name]
    arguments = _arguments(call)
    assert set(spec["required"]) <= set(arguments) <= set(spec["properties"])  # held to the tool's schema
    assert all(isinstance(arguments[k], str if spec["properties"][k]["type"] == "string" else int) for k in arguments)


def test_a_named_tool_is_the_one_called_and_the_stream_sends_the_same_call(client):
    named = {"type": "function", "function": {"name": "book_hotel"}}
    reply = client.chat.completions.create(
        model=SERVED, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "book_hotel" and {"city", "nights"} <= set(_arguments(call))
    chunks = list(
        client.chat.completions.create(
            model=SERVED, messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60, temperature=0, stream=True
        )
    )
    streamed = [c.choices[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(streamed) == 1 and streamed[0].finish_reason == "tool_calls"
    (delta,) = streamed[0].delta.tool_calls
    assert (delta.index, delta.function.name, delta.function.arguments) == (0, "book_hotel", call.function.arguments)


def test_a_tool_result_goes_back_with_its_call_id_and_the_model_answers(client, server):
    reply = client.chat.completions.create(
        model=SERVED, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60, temperature=0
    )
    call = reply.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        reply.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "TAP 1234 at 250 euros"},
    ]
    answer = client.chat.completions.create(
        model=SERVED, messages=history, tools=TOOLS, tool_choice="none", max_tokens=12, temperature=0
    )
    assert answer.choices[0].message.tool_calls is None and answer.usage.prompt_tokens > reply.usage.prompt_tokens
    # the history reached the prompt: the earlier call and the tool's result (the prompt's cached prefix is the
    # first request's whole prompt, so the second extends it)
    assert answer.usage.prompt_tokens_details.cached_tokens >= reply.usage.prompt_tokens // 16 * 16 - 16


def test_response_format_json_schema_gives_json_of_that_schema(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model=SERVED,
        messages=[{"role": "user", "content": "A trip plan for Oslo, as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "plan", "schema": schema}},
    )
    plan = json.loads(reply.choices[0].message.content)
    assert set(plan) == {"city", "days"} and isinstance(plan["city"], str) and isinstance(plan["days"], int)
    anything = client.chat.completions.create(
        model=SERVED, messages=ASK, max_tokens=40, temperature=0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "bad", "parameters": {"type": "nonsense"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_unusable_tool_requests_get_a_400_and_the_server_goes_on(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": SERVED, "messages": ASK, **body}, timeout=60)
    assert r.status_code == 400 and param in r.text, r.text
    ok = httpx.post(
        server.url + "/v1/chat/completions", json={"model": SERVED, "messages": ASK, "max_tokens": 2}, timeout=60
    )
    assert ok.status_code == 200


def test_history_renders_calls_and_results_in_the_models_syntax_and_parsing_never_guesses():
    messages = prompt_messages(
        [
            {"role": "system", "content": "You book trips."},
            {"role": "user", "content": "Lisbon?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "search_flights", "arguments": '{"city": "Lisbon"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "TAP 1234"},
        ],
        TOOLS,
        template_takes_tools=False,
    )
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"].startswith("You book trips.") and '"name": "book_hotel"' in messages[0]["content"]
    assert (
        messages[2]["content"] == '<tool_call>[{"name": "search_flights", "arguments": {"city": "Lisbon"}}]</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\nTAP 1234\n</tool_response>"
    assert prompt_messages([{"role": "user", "content": "hi"}], [], template_takes_tools=False) == [
        {"role": "user", "content": "hi"}
    ]
    content, calls = parse_tool_calls(
        'Sure. <tool_call>[{"name": "book_hotel", "arguments": {"nights": 2}}]</tool_call>', TOOLS
    )
    assert content == "Sure." and calls[0]["function"] == {"name": "book_hotel", "arguments": '{"nights": 2}'}
    for text in (
        '<tool_call>[{"name": "unknown", "arguments": {}}]</tool_call>',
        "<tool_call>[{not json",
        "no call at all",
    ):
        assert parse_tool_calls(text, TOOLS) == (text, None)


def test_a_pydantic_ai_agent_with_a_structured_output_runs_unchanged(server):
    """pydantic-ai asks for its output through a `final_result` tool with `tool_choice` required: the grammar holds
    the 135M model to that tool's schema, and the run returns a validated object on its first request."""
    from pydantic import BaseModel
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class TripPlan(BaseModel):
        city: str
        nights: int

    model = OpenAIChatModel(SERVED, provider=OpenAIProvider(base_url=server.url + "/v1", api_key="none"))
    agent = Agent(model, output_type=TripPlan, model_settings={"max_tokens": 60, "temperature": 0})
    result = agent.run_sync("Plan three nights in Lisbon.")
    assert isinstance(result.output, TripPlan) and result.output.city and result.output.nights >= 0
    calls = [p for m in result.all_messages() for p in m.parts if getattr(p, "tool_name", None) == "final_result"]
    assert len(calls) == 2 and result.usage.requests == 1  # the call and its return, from one request
