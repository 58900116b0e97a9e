"""What the agent scenarios share (`agent_scenarios`, `framework_scenarios`): the served model's name, the
conversation's shape (a system prompt, a brief, tools that take time, one message too long for the server), and
how conversations run (in turn or at once)."""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor

SERVED = "smollm2"
SYSTEM = "You are the booking agent of a travel company. Plan the trip, then call tools to book it. " * 4
TOOL_S = {"search_flights": 0.45, "book_hotel": 0.3}
TOO_LONG = "again " * 1500  # more tokens than the test servers' contexts (512 here, 1024 in the live vLLM test)
CONVERSATION: contextvars.ContextVar[str] = contextvars.ContextVar("conversation")  # whose reply a client hook reads
SESSION_HEADER = "X-Session-ID"  # the session header vLLM 0.32+ (and kvobs serve) put on their KV events


def trip(name: str, config: dict) -> str:
    """A conversation's opening brief: its name in it, so that conversations differ in length as real ones do."""
    return f"Trip {name}: plan every leg, every hotel and every meal for the whole family. " * config.get("repeat", 6)


def system(config: dict) -> str:
    """The system prompt every conversation shares: `system_repeat` times the usual (one longer than a 128-token
    block, so an engine of such blocks caches it once for all: the usual is shorter)."""
    return SYSTEM * config.get("system_repeat", 1)


def tool_s(name: str, config: dict) -> float:
    """How long a tool takes: `tool_scale` times its usual time (a slow server needs longer pauses to lose blocks)."""
    return TOOL_S[name] * config.get("tool_scale", 1)


def at_once(conversation, config: dict) -> None:
    """Each conversation of `config` in turn, or all at once (`concurrent`: a thread each, as a server sees its
    users)."""
    if not config.get("concurrent"):
        for name in config["conversations"]:
            conversation(name)
        return
    with ThreadPoolExecutor(len(config["conversations"])) as pool:
        list(pool.map(conversation, config["conversations"]))


def travel_tools(config: dict) -> tuple:
    """The two tools a conversation calls, as plain functions (their names and docstrings are what a framework that
    wraps a function shows its model), each taking its time (`tool_s`)."""

    def search_flights(city: str) -> str:
        """Find flights to a city."""
        time.sleep(tool_s("search_flights", config))
        return f"three flights to {city}"

    def book_hotel(city: str) -> str:
        """Book a hotel in a city."""
        time.sleep(tool_s("book_hotel", config))
        return f"hotel booked in {city}"

    return search_flights, book_hotel


def id_reading_client(answered: dict[str, list[str]]):
    """An HTTP client that files each answered reply's id under the conversation running (`CONVERSATION`): the truth
    for a framework whose spans keep no reply id."""
    import httpx

    def read_id(response) -> None:
        response.read()
        if response.status_code == 200:
            answered[CONVERSATION.get()].append(response.json()["id"])

    return httpx.Client(event_hooks={"response": [read_id]})
