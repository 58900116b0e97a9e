"""Agents as users write them, each traced by its own instrumentation package and exporting OTLP/HTTP to a
collector; run one per process (`agent_harness.Harness.agent`):

    python -m tests.collectors.agent_scenarios SCENARIO '{"base_url": ..., "otlp": ..., "service": ...}'

It prints one JSON line: `answered` (conversation -> the response ids the server answered, in order) and what
else the scenario knows of itself (tool times, trace ids). Nothing here knows kvobs: the server is any
OpenAI-compatible one, the spans go wherever `otlp` says.
"""

from __future__ import annotations

import contextvars
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

SERVED = "smollm2"
SYSTEM = "You are the booking agent of a travel company. Plan the trip, then call tools to book it. " * 4
TOOL_S = {"search_flights": 0.45, "book_hotel": 0.3}
TOO_LONG = "again " * 1500  # more tokens than the test servers' contexts (512 here, 1024 in the live vLLM test)
CONVERSATION: contextvars.ContextVar[str] = contextvars.ContextVar("conversation")  # whose reply a client hook reads
SESSION_HEADER = "X-Session-ID"  # the session header vLLM 0.32+ (and kvobs serve) put on their KV events


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
        brief = f"Trip {conversation}: plan every leg, every hotel and every meal for the whole family. " * 6
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
    passed on so that each conversation keeps its `gen_ai.conversation.id`."""
    from pydantic_ai import Agent, InstrumentationSettings
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    Agent.instrument_all(InstrumentationSettings(tracer_provider=provider))
    model = OpenAIChatModel(SERVED, provider=OpenAIProvider(base_url=config["base_url"], api_key="none"))
    agent = Agent(
        model,
        name="planner",
        model_settings={"max_tokens": 6},
        instructions="You plan trips for a travel company. Answer in one short sentence.",
    )
    answered = {}
    for city in ("Lisbon", "Oslo"):
        result, history = None, None
        for question in (f"A trip to {city}?", "Which month?", "How long?"):
            result = agent.run_sync(question, message_history=history)
            history = result.all_messages()
        ids = [m.provider_response_id for m in history if getattr(m, "provider_response_id", None)]
        answered[result.conversation_id] = ids
    return {"answered": answered}


def plain_loop(provider, config: dict) -> dict:
    """A loop over the OpenAI client instrumented by `instrumentation` (the official `openai-v2` or OpenLLMetry's
    `openllmetry-openai`), the conversation in one span of its own; three calls and one refused as too long."""
    import importlib

    module = {
        "openai-v2": "opentelemetry.instrumentation.openai_v2",
        "openllmetry-openai": "opentelemetry.instrumentation.openai",
    }[config["instrumentation"]]
    importlib.import_module(module).OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = openai.OpenAI(base_url=config["base_url"], api_key="none", max_retries=0)
    messages, ids, refused = [{"role": "user", "content": "Plan a trip to Rome."}], [], False
    with provider.get_tracer("own-loop").start_as_current_span("conversation") as root:
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


def at_once(conversation, config: dict) -> None:
    """Each conversation of `config` in turn, or all at once (`concurrent`: a thread each, as a server sees its
    users)."""
    if not config.get("concurrent"):
        for name in config["conversations"]:
            conversation(name)
        return
    with ThreadPoolExecutor(len(config["conversations"])) as pool:
        list(pool.map(conversation, config["conversations"]))


def langchain(provider, config: dict) -> dict:
    """LangChain's chat model (`langchain-openai`'s `ChatOpenAI`) and `@tool`s, traced by OpenInference's LangChain
    instrumentation under `using_session`; no header and no trace context reach the server (as a user's agent
    runs it): three calls a conversation with a tool between them, the last one too long where `too_long` names
    the conversation. The ids answered are the ones LangChain hands back (`response_metadata["id"]`)."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from openinference.instrumentation import using_session
    from openinference.instrumentation.langchain import LangChainInstrumentor

    LangChainInstrumentor().instrument(tracer_provider=provider)

    def model_for(name: str) -> ChatOpenAI:  # with `header`, each conversation's model sends its session
        headers = {SESSION_HEADER: name} if config.get("header") else None
        return ChatOpenAI(
            model=SERVED,
            base_url=config["base_url"],
            api_key="none",
            max_retries=0,
            max_tokens=6,
            temperature=0,
            default_headers=headers,
        )

    @tool
    def search_flights(city: str) -> str:
        """Find flights to a city."""
        time.sleep(TOOL_S["search_flights"])
        return f"three flights to {city}"

    @tool
    def book_hotel(city: str) -> str:
        """Book a hotel in a city."""
        time.sleep(TOOL_S["book_hotel"])
        return f"hotel booked in {city}"

    def conversation(name: str) -> list[str]:
        brief = f"Trip {name}: plan every leg, every hotel and every meal for the whole family. " * config.get(
            "repeat", 6
        )
        messages, ids, model = [SystemMessage(SYSTEM), HumanMessage(brief)], [], model_for(name)
        for step in (search_flights, book_hotel, None):
            if step is None and name == config.get("too_long"):
                messages.append(HumanMessage(TOO_LONG))
            try:
                reply = model.invoke(messages)
            except Exception as exc:  # openai.BadRequestError, as LangChain raises it
                if "400" not in str(exc) and "BadRequest" not in type(exc).__name__:
                    raise
                continue
            ids.append(reply.response_metadata["id"])
            messages.append(AIMessage(reply.content))
            if step is not None:
                messages.append(HumanMessage(step.invoke({"city": "Lisbon"})))
        return ids

    agent = RunnableLambda(conversation, name="travel-agent")

    answered = {}

    def run(name: str) -> None:
        with using_session(name):
            answered[name] = agent.invoke(name)

    at_once(run, config)
    return {"answered": {name: answered[name] for name in config["conversations"]}}


def openai_agents(provider, config: dict) -> dict:
    """The OpenAI Agents SDK on a chat-completions model (what an OpenAI-compatible server speaks), traced by
    OpenInference's instrumentation of the SDK's own tracing: a conversation is one SDK `trace` (its `group_id`)
    under `using_session`, three runs with a tool between them (a `function_span` of the SDK's), the last run too
    long where `too_long` names the conversation. The SDK's generation spans hold the reply's messages and usage but
    not its id: the ids answered are read off the HTTP replies by the agent's own client."""
    import asyncio

    import httpx
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_trace_processors, trace
    from agents.tracing import function_span
    from openinference.instrumentation import using_session
    from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    set_trace_processors([])  # no upload to OpenAI's platform: only OpenInference's processor
    OpenAIAgentsInstrumentor().instrument(tracer_provider=provider)
    answered: dict[str, list[str]] = {name: [] for name in config["conversations"]}

    async def read_id(response: httpx.Response) -> None:
        await response.aread()
        if response.status_code == 200:
            answered[CONVERSATION.get()].append(response.json()["id"])

    async def run() -> dict:
        http = httpx.AsyncClient(event_hooks={"response": [read_id]})

        async def conversation(name: str) -> None:
            CONVERSATION.set(name)  # (each task its own context: the hook reads whose reply it is)
            headers = {SESSION_HEADER: name} if config.get("header") else None  # `header`: its session on each call
            client = openai.AsyncOpenAI(
                base_url=config["base_url"], api_key="none", max_retries=0, http_client=http, default_headers=headers
            )
            model = OpenAIChatCompletionsModel(model=SERVED, openai_client=client)
            settings = ModelSettings(max_tokens=6)
            agent = Agent(name="travel-agent", instructions=SYSTEM, model=model, model_settings=settings)
            brief = f"Trip {name}: plan every leg, every hotel and every meal for the whole family. " * config.get(
                "repeat", 6
            )
            items: list = [{"role": "user", "content": brief}]
            with using_session(name), trace("travel-agent", group_id=name):
                for tool in ("search_flights", "book_hotel", None):
                    if tool is None and name == config.get("too_long"):
                        items.append({"role": "user", "content": TOO_LONG})
                    try:
                        result = await Runner.run(agent, items)
                    except openai.BadRequestError:
                        continue
                    items = result.to_input_list()
                    if tool is not None:
                        with function_span(tool, input='{"city": "Lisbon"}') as span:
                            await asyncio.sleep(TOOL_S[tool])
                            span.span_data.output = f"{tool} done for Lisbon"
                        items.append({"role": "user", "content": f"{tool} done for Lisbon"})

        if config.get("concurrent"):
            await asyncio.gather(*(asyncio.create_task(conversation(name)) for name in config["conversations"]))
        else:
            for name in config["conversations"]:
                await asyncio.create_task(conversation(name))
        await http.aclose()
        return {"answered": answered}

    return asyncio.run(run())


def smolagents(provider, config: dict) -> dict:
    """smolagents' model (`OpenAIServerModel`) and `@tool`s, traced by `openinference-instrumentation-smolagents`
    under `using_session`, a conversation in one span: three model calls with a tool between them, the last too
    long where `too_long` names the conversation. Its LLM spans keep the reply's text and token counts, not its id (its
    `ChatMessage` leaves the raw reply out): the ids answered are read off the HTTP replies by the agent's own
    client."""
    import httpx
    from openinference.instrumentation import using_session
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor
    from smolagents import OpenAIServerModel, tool
    from smolagents.models import ChatMessage, MessageRole

    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    answered: dict[str, list[str]] = {name: [] for name in config["conversations"]}

    def read_id(response: httpx.Response) -> None:
        response.read()
        if response.status_code == 200:
            answered[CONVERSATION.get()].append(response.json()["id"])

    http = httpx.Client(event_hooks={"response": [read_id]})
    model = OpenAIServerModel(
        model_id=SERVED,
        api_base=config["base_url"],
        api_key="none",
        client_kwargs={"max_retries": 0, "http_client": http},
    )

    @tool
    def search_flights(city: str) -> str:
        """Find flights to a city.

        Args:
            city: where to fly.
        """
        time.sleep(TOOL_S["search_flights"])
        return f"three flights to {city}"

    @tool
    def book_hotel(city: str) -> str:
        """Book a hotel in a city.

        Args:
            city: where to stay.
        """
        time.sleep(TOOL_S["book_hotel"])
        return f"hotel booked in {city}"

    def said(role: MessageRole, text: str) -> ChatMessage:
        return ChatMessage(role=role, content=[{"type": "text", "text": text}])

    def conversation(name: str) -> None:
        CONVERSATION.set(name)  # (each thread its own context: the hook reads whose reply it is)
        brief = f"Trip {name}: plan every leg, every hotel and every meal for the whole family. " * 6
        messages = [said(MessageRole.SYSTEM, SYSTEM), said(MessageRole.USER, brief)]
        with using_session(name), provider.get_tracer("travel-agent").start_as_current_span("conversation"):
            for step in (search_flights, book_hotel, None):
                if step is None and name == config.get("too_long"):
                    messages.append(said(MessageRole.USER, TOO_LONG))
                try:
                    reply = model.generate(messages, max_tokens=6)
                except openai.BadRequestError:
                    continue
                messages.append(said(MessageRole.ASSISTANT, reply.content or ""))
                if step is not None:
                    messages.append(said(MessageRole.USER, step(city="Lisbon")))

    at_once(conversation, config)
    return {"answered": answered}


SCENARIOS = {
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
