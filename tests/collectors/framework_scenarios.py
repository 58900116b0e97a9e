"""Agents built on frameworks (LangChain, the OpenAI Agents SDK, smolagents, LlamaIndex, Agno), each traced by its own
OpenInference instrumentation package, as `agent_scenarios` runs them (one per process). Nothing here knows
kvobs."""

from __future__ import annotations

import time

import openai

from tests.collectors.scenario_parts import (
    CONVERSATION,
    SERVED,
    SESSION_HEADER,
    SYSTEM,
    TOO_LONG,
    at_once,
    id_reading_client,
    system,
    tool_s,
    travel_tools,
    trip,
)


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
        time.sleep(tool_s("search_flights", config))
        return f"three flights to {city}"

    @tool
    def book_hotel(city: str) -> str:
        """Book a hotel in a city."""
        time.sleep(tool_s("book_hotel", config))
        return f"hotel booked in {city}"

    def conversation(name: str) -> list[str]:
        brief = trip(name, config)
        messages, ids, model = [SystemMessage(system(config)), HumanMessage(brief)], [], model_for(name)
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
            brief = trip(name, config)
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
                            await asyncio.sleep(tool_s(tool, config))
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
    from openinference.instrumentation import using_session
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor
    from smolagents import OpenAIServerModel, tool
    from smolagents.models import ChatMessage, MessageRole

    SmolagentsInstrumentor().instrument(tracer_provider=provider)
    answered: dict[str, list[str]] = {name: [] for name in config["conversations"]}
    model = OpenAIServerModel(
        model_id=SERVED,
        api_base=config["base_url"],
        api_key="none",
        client_kwargs={"max_retries": 0, "http_client": id_reading_client(answered)},
    )

    @tool
    def search_flights(city: str) -> str:
        """Find flights to a city.

        Args:
            city: where to fly.
        """
        time.sleep(tool_s("search_flights", config))
        return f"three flights to {city}"

    @tool
    def book_hotel(city: str) -> str:
        """Book a hotel in a city.

        Args:
            city: where to stay.
        """
        time.sleep(tool_s("book_hotel", config))
        return f"hotel booked in {city}"

    def said(role: MessageRole, text: str) -> ChatMessage:
        return ChatMessage(role=role, content=[{"type": "text", "text": text}])

    def conversation(name: str) -> None:
        CONVERSATION.set(name)  # (each thread its own context: the hook reads whose reply it is)
        brief = trip(name, config)
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


def llamaindex(provider, config: dict) -> dict:
    """LlamaIndex's OpenAI-compatible chat model (`llama-index-llms-openai-like`'s `OpenAILike`) and
    `FunctionTool`s, traced by `openinference-instrumentation-llama-index` under `using_session`: three chat calls a
    conversation with a tool between them, the last one too long where `too_long` names the conversation. Runs in
    its own virtual environment (`.venv-llamaindex`: LlamaIndex's OpenAI package pins `openai<3`); a conversation is
    one span of LlamaIndex's own instrumentation dispatcher. The ids answered
    are the ones LlamaIndex hands back (the raw reply's `id`)."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.tools import FunctionTool
    from llama_index.llms.openai_like import OpenAILike
    from openinference.instrumentation import using_session
    from openinference.instrumentation.llama_index import LlamaIndexInstrumentor

    LlamaIndexInstrumentor().instrument(tracer_provider=provider)
    tools = [FunctionTool.from_defaults(fn) for fn in travel_tools(config)]

    @get_dispatcher("travel-agent").span  # LlamaIndex's own span: a conversation in one trace
    def conversation(name: str) -> list[str]:
        llm = OpenAILike(
            model=SERVED,
            api_base=config["base_url"],
            api_key="none",
            is_chat_model=True,
            context_window=config.get("context_window", 512),
            max_tokens=6,
            temperature=0,
            max_retries=0,
            default_headers={SESSION_HEADER: name} if config.get("header") else None,
        )
        brief = trip(name, config)
        messages = [
            ChatMessage(role=MessageRole.SYSTEM, content=SYSTEM),
            ChatMessage(role=MessageRole.USER, content=brief),
        ]
        ids = []
        for tool in (*tools, None):
            if tool is None and name == config.get("too_long"):
                messages.append(ChatMessage(role=MessageRole.USER, content=TOO_LONG))
            try:
                reply = llm.chat(messages)
            except openai.BadRequestError:
                continue
            ids.append(reply.raw.id)
            messages.append(reply.message)
            if tool is not None:
                messages.append(ChatMessage(role=MessageRole.USER, content=str(tool.call(city="Lisbon"))))
        return ids

    answered = {}

    def run(name: str) -> None:
        with using_session(name):
            answered[name] = conversation(name)

    at_once(run, config)
    return {"answered": {name: answered[name] for name in config["conversations"]}}


def agno(provider, config: dict) -> dict:
    """Agno's OpenAI-compatible model (`agno.models.openai.like.OpenAILike`) and its function calls, traced by
    `openinference-instrumentation-agno` under `using_session`: three model calls a conversation with a tool (run as
    Agno's own `FunctionCall`, its span a tool span) between them, the last too long where `too_long` names the
    conversation. Its LLM spans (`<model>.invoke`) keep the reply's text and token counts, not its id, and a refusal
    is its own exception class (`ModelProviderError`, which carries the status): the ids answered are read off the
    HTTP replies by the agent's own client."""
    from agno.exceptions import ModelProviderError
    from agno.models.message import Message
    from agno.models.openai.like import OpenAILike
    from agno.tools.function import Function, FunctionCall
    from openinference.instrumentation import using_session
    from openinference.instrumentation.agno import AgnoInstrumentor

    AgnoInstrumentor().instrument(tracer_provider=provider)
    answered: dict[str, list[str]] = {name: [] for name in config["conversations"]}
    model = OpenAILike(
        id=SERVED,
        base_url=config["base_url"],
        api_key="none",
        max_tokens=6,
        temperature=0,
        max_retries=0,
        http_client=id_reading_client(answered),
    )
    tools = [Function.from_callable(fn) for fn in travel_tools(config)]

    def conversation(name: str) -> None:
        CONVERSATION.set(name)
        messages = [Message(role="system", content=SYSTEM), Message(role="user", content=trip(name, config))]
        with using_session(name), provider.get_tracer("travel-agent").start_as_current_span("conversation"):
            for tool in (*tools, None):
                if tool is None and name == config.get("too_long"):
                    messages.append(Message(role="user", content=TOO_LONG))
                try:
                    reply = model.response(messages=list(messages))  # (it appends its reply to the list it is given)
                except ModelProviderError:
                    continue
                messages.append(Message(role="assistant", content=reply.content or ""))
                if tool is not None:
                    call = FunctionCall(function=tool, arguments={"city": "Lisbon"})
                    call.execute()
                    messages.append(Message(role="user", content=str(call.result)))

    at_once(conversation, config)
    return {"answered": answered}
