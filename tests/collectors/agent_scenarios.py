"""Agents as users write them, each traced by its own instrumentation package and exporting OTLP/HTTP to a
collector; run one per process (`agent_harness.Harness.agent`):

    python -m tests.collectors.agent_scenarios SCENARIO '{"base_url": ..., "otlp": ..., "service": ...}'

It prints one JSON line: `answered` (conversation -> the response ids the server answered, in order) and what
else the scenario knows of itself (tool times, trace ids). Nothing here knows kvobs: the server is any
OpenAI-compatible one, the spans go wherever `otlp` says.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import openai
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tests.collectors.framework_scenarios import agno, langchain, llamaindex, openai_agents, smolagents
from tests.collectors.scenario_parts import SERVED, SESSION_HEADER, SYSTEM, TOO_LONG, TOOL_S, at_once, trip


def openinference(provider, config: dict) -> dict:
    """OpenInference: the OpenAI client instrumented, an `OITracer` agent span per conversation under
    `using_session`, tools as `@tracer.tool`; three calls a conversation with a tool between them, the last one
    too long for the server where `too_long` names the conversation. `hide_outputs`: OpenInference's privacy
    setting (no reply, so no response id, in the spans). `headers`: `session` sends the session header,
    `traceparent` the agent span's trace context, else nothing."""
    from openinference.instrumentation import OITracer, TraceConfig, using_session
    from openinference.instrumentation.openai import OpenAIInstrumentor

    trace_config = TraceConfig(hide_outputs=config.get("hide_outputs", False))
    OpenAIInstrumentor().instrument(tracer_provider=provider, config=trace_config)
    tracer = OITracer(provider.get_tracer("travel-agent"), config=trace_config)
    client = openai.OpenAI(base_url=config["base_url"], api_key="none", max_retries=0)

    @tracer.tool(name="search_flights")
    def search_flights(city: str) -> str:
        time.sleep(TOOL_S["search_flights"])
        return f"three flights to {city}"

    @tracer.tool(name="book_hotel")
    def book_hotel(city: str) -> str:
        time.sleep(TOOL_S["book_hotel"])
        return f"hotel booked in {city}"

    answered = {}
    for conversation, headers in config["conversations"].items():
        answered[conversation] = []
        brief = trip(conversation, config)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": brief}]
        with using_session(conversation), tracer.start_as_current_span("travel-agent", openinference_span_kind="agent"):
            for tool in (search_flights, book_hotel, None):
                extra = {}
                if headers == "session":
                    extra[SESSION_HEADER] = conversation
                elif headers == "traceparent":
                    propagate.inject(extra)
                if tool is None and conversation == config.get("too_long"):
                    messages.append({"role": "user", "content": TOO_LONG})
                try:
                    reply = client.chat.completions.create(
                        model=SERVED, messages=messages, max_tokens=6, temperature=0, extra_headers=extra
                    )
                except openai.BadRequestError:
                    continue
                answered[conversation].append(reply.id)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                if tool is not None:
                    messages.append({"role": "user", "content": tool("Lisbon")})
    return {"answered": answered}


def pydantic_ai(provider, config: dict) -> dict:
    """pydantic-ai's own instrumentation (GenAI): an agent, two conversations of three runs each, the history
    passed on so that each conversation keeps its `gen_ai.conversation.id`. With `conversations`: those trips
    instead (`conversation_id` the name), a tool's time between runs, at once where `concurrent`."""
    from pydantic_ai import Agent, InstrumentationSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
    model = OpenAIChatModel(SERVED, provider=OpenAIProvider(base_url=config["base_url"], api_key="none"))
    trips = "conversations" in config
    agent = Agent(
        model,
        name="planner",
        model_settings={"max_tokens": 6},
        instructions=SYSTEM if trips else "You plan trips for a travel company. Answer in one short sentence.",
    )

    def ids_of(history) -> list[str]:
        return [m.provider_response_id for m in history if getattr(m, "provider_response_id", None)]

    if not trips:
        answered = {}
        for city in ("Lisbon", "Oslo"):
            result, history = None, None
            for question in (f"A trip to {city}?", "Which month?", "How long?"):
                result = agent.run_sync(question, message_history=history)
                history = result.all_messages()
            answered[result.conversation_id] = ids_of(history)
        return {"answered": answered}

    answered = {}

    async def conversation(name: str) -> None:
        prompt, history = trip(name, config), None
        for tool in ("search_flights", "book_hotel", None):
            result = await agent.run(prompt, message_history=history, conversation_id=name)
            history = result.all_messages()
            if tool is not None:
                await asyncio.sleep(TOOL_S[tool])
                prompt = f"{tool} done for Lisbon"
        answered[name] = ids_of(history)

    async def run() -> None:  # at once in one event loop (the provider's client is the loop's), else in turn
        if config.get("concurrent"):
            await asyncio.gather(*(conversation(name) for name in config["conversations"]))
        else:
            for name in config["conversations"]:
                await conversation(name)

    asyncio.run(run())
    return {"answered": {name: answered[name] for name in config["conversations"]}}


def plain_loop(provider, config: dict) -> dict:
    """A loop over the OpenAI client instrumented by `instrumentation` (the official `openai-v2` or OpenLLMetry's
    `openllmetry-openai`), the conversation in one span of its own; three calls and one refused as too long. With
    `conversations`: those trips instead, each in a span of its own (its trace the session), a tool's time between
    calls, at once where `concurrent`."""
    import importlib

    module = {
        "openai-v2": "opentelemetry.instrumentation.openai_v2",
        "openllmetry-openai": "opentelemetry.instrumentation.openai",
    }[config["instrumentation"]]
    importlib.import_module(module).OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = openai.OpenAI(base_url=config["base_url"], api_key="none", max_retries=0)
    tracer = provider.get_tracer("own-loop")
    if "conversations" in config:  # a session is a trace here: the conversation's span opens it, ends it last
        answered = {}

        def conversation(name: str) -> None:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": trip(name, config)}]
            ids = []
            with tracer.start_as_current_span("conversation") as root:
                for tool in ("search_flights", "book_hotel", None):
                    reply = client.chat.completions.create(model=SERVED, messages=messages, max_tokens=6)
                    ids.append(reply.id)
                    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
                    if tool is not None:
                        time.sleep(TOOL_S[tool])
                        messages.append({"role": "user", "content": f"{tool} done for Lisbon"})
            answered[name] = (format(root.get_span_context().trace_id, "032x"), ids)

        at_once(conversation, config)
        return {"answered": dict(answered[name] for name in config["conversations"])}
    messages, ids, refused = [{"role": "user", "content": "Plan a trip to Rome."}], [], False
    with tracer.start_as_current_span("conversation") as root:
        for turn in range(3):
            reply = client.chat.completions.create(model=SERVED, messages=messages, max_tokens=6)
            ids.append(reply.id)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": f"And step {turn + 1}?"},
            ]
        try:
            client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": TOO_LONG}])
        except openai.BadRequestError:
            refused = True
    trace_id = format(root.get_span_context().trace_id, "032x")
    return {"answered": {trace_id: ids}, "refused": refused}


SCENARIOS = {
    "agno": agno,
    "llamaindex": llamaindex,
    "smolagents": smolagents,
    "openai_agents": openai_agents,
    "openinference": openinference,
    "pydantic_ai": pydantic_ai,
    "plain_loop": plain_loop,
    "langchain": langchain,
}


def main(scenario: str, config: dict) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": config["service"]}))
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=config["otlp"]), schedule_delay_millis=200)
    )
    try:
        result = SCENARIOS[scenario](provider, config)
    finally:
        provider.shutdown()  # flushes every span before the process ends
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
