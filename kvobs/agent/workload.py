"""A realistic agent workload: ReAct-style sessions through the agent SDK (`kvobs agents`).

Every session is one agent of a kind (researcher, coder, planner) with the shared long system prompt plus its own
instructions. Each step asks the model for its next thought and action (an `agent_step` with a `chat` call), then
runs a tool (an `execute_tool` span) that pauses for a time drawn from the pause distribution and returns a result;
the reply and the result join the context, so the prompt grows every step and its prefix must survive the pause in
the cache. A step fails on its deadline, an HTTP error, or (planner) a reply that is not a JSON object.

Deterministic for a seed: session ids, kinds, tasks, pauses and tool results come from `random.Random(seed, i)`.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import httpx
from opentelemetry.trace import TracerProvider

from kvobs.agent.calibrate import DEFAULT_CONCURRENCY, Measurement
from kvobs.agent.chat import ChatError
from kvobs.agent.routing import ROUTINGS, StepRouter
from kvobs.agent.session import AgentSession, AgentStep, StepRecorder
from kvobs.semconv.spans import StepErrorType

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 300.0  # the engine's first requests on a slow machine

SHARED_SYSTEM = (
    "You are an operations agent of Northwind Travel. You work in steps. In each step you think about what is known, "
    "choose one tool, and wait for its result before the next step. Tools: search (the web), flights (status and "
    "prices of flights), weather (forecasts), calendar (the customer's plans), code (runs Python). Be brief: one "
    "thought of one sentence, then the tool and its input. Never invent tool results. If a tool fails, try another. "
    "Customers are busy travellers; their plans change often and they expect answers within a minute. Respect "
    "budgets, keep to the customer's dates, prefer direct flights, and say when you are unsure. "
)


@dataclass(frozen=True)
class AgentKind:
    name: str
    instructions: str
    tools: tuple[str, ...]
    requires_json: bool = False


KINDS = (
    AgentKind(
        "researcher",
        "You research destinations: sights, opening hours, events. Answer as 'Thought: ... Action: tool(input)'.",
        ("search", "weather"),
    ),
    AgentKind(
        "coder",
        "You write small Python programs that compare prices and schedules. Answer as "
        "'Thought: ... Action: code(program)'.",
        ("code", "flights"),
    ),
    AgentKind(
        "planner",
        'You plan itineraries. Answer only with a JSON object: {"thought": "...", "tool": "...", "input": "..."}.',
        ("calendar", "flights", "weather"),
        requires_json=True,
    ),
)
TASKS = (
    "a weekend in Lisbon",
    "a conference trip to Berlin",
    "a family week in Rome",
    "a hike near Innsbruck",
    "a wedding in Dublin",
    "three days in Kyoto",
    "a client visit in Chicago",
    "a stopover in Singapore",
)
WORDS = (
    "gate",
    "delayed",
    "sunny",
    "museum",
    "closed",
    "price",
    "EUR",
    "direct",
    "transfer",
    "rain",
    "hotel",
    "booked",
    "open",
    "ticket",
    "platform",
    "window",
    "seat",
    "late",
    "early",
    "confirmed",
)
_PAUSE = re.compile(r"^(?:(const|uniform|exp|lognormal):)?([\d.]+)(?:[-,]([\d.]+))?$")


@dataclass(frozen=True)
class PauseDistribution:
    """Tool pauses in milliseconds: `300` or `const:300`, `uniform:100-900`, `exp:500` (mean), `lognormal:500,0.8`
    (median, sigma)."""

    kind: str
    a: float
    b: float | None = None

    @classmethod
    def parse(cls, text: str) -> PauseDistribution:
        match = _PAUSE.match(text.strip())
        if match is None:
            raise ValueError(
                f"not a pause distribution: {text!r} (examples: 300, uniform:100-900, exp:500, "
                "lognormal:500,0.8; milliseconds)"
            )
        kind, a, b = match.group(1) or "const", float(match.group(2)), match.group(3)
        if kind in ("uniform", "lognormal") and b is None:
            raise ValueError(
                f"pause distribution {text!r} needs two numbers (uniform:LOW-HIGH, lognormal:MEDIAN,SIGMA)"
            )
        if kind == "uniform" and float(b) < a:
            raise ValueError(f"pause distribution {text!r}: the upper bound is below the lower one")
        return cls(kind, a, None if b is None else float(b))

    def sample_s(self, rng: random.Random) -> float:
        if self.kind == "const":
            ms = self.a
        elif self.kind == "uniform":
            ms = rng.uniform(self.a, self.a if self.b is None else self.b)
        elif self.kind == "exp":
            ms = rng.expovariate(1.0 / self.a) if self.a > 0 else 0.0
        else:
            ms = rng.lognormvariate(math.log(max(self.a, 1e-9)), 0.0 if self.b is None else self.b)
        return ms / 1000.0


@dataclass
class WorkloadConfig:
    base_url: str  # the server; with `replica_urls`, the first of them
    sessions: int = 8
    concurrency: int = DEFAULT_CONCURRENCY
    steps: int = 4
    tool_pause: PauseDistribution = field(default_factory=lambda: PauseDistribution("exp", 500.0))
    step_deadline_s: float | None = 30.0
    max_tokens: int = 48
    seed: int = 0
    model: str | None = None
    timeout_s: float = 120.0
    replica_urls: tuple[str, ...] = ()  # several servers: each step goes to one of them, by `routing`
    routing: str = "round_robin"  # kvobs.agent.routing.ROUTINGS

    @property
    def urls(self) -> tuple[str, ...]:
        """Every server the steps may go to."""
        return self.replica_urls or (self.base_url,)

    def __post_init__(self) -> None:
        for name in ("sessions", "concurrency", "steps", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1; got {getattr(self, name)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"--routing must be one of {', '.join(ROUTINGS)}; got {self.routing!r}")
        if self.step_deadline_s is not None and self.step_deadline_s <= 0:
            raise ValueError(f"--step-deadline-s must be positive; got {self.step_deadline_s}")


@dataclass
class WorkloadResult:
    sessions: int = 0
    steps: int = 0
    failed: Counter = field(default_factory=Counter)  # error type -> steps
    wall_s: float = 0.0

    @property
    def num_failed(self) -> int:
        return sum(self.failed.values())

    def failed_summary(self) -> str:
        """Failed steps by error type, most first ("invalid_response 6, timeout 1"), or "none"."""
        return ", ".join(f"{kind} {n}" for kind, n in self.failed.most_common()) or "none"


def check_rounds(rounds: int, round_pause_s: float = 0.0) -> None:
    if rounds < 0:
        raise ValueError(f"--rounds must be 0 (until stopped) or more; got {rounds}")
    if round_pause_s < 0:
        raise ValueError(f"--round-pause-s must not be negative; got {round_pause_s}")


def round_configs(
    config: WorkloadConfig, rounds: int, round_pause_s: float, stop: threading.Event
) -> Iterator[WorkloadConfig]:
    """Each round's config: round r runs seed + r, so every round has new sessions; `rounds` 0 means until `stop`.
    Waits `round_pause_s` between rounds and ends as soon as `stop` is set."""
    index = 0
    while not stop.is_set() and (rounds == 0 or index < rounds):
        if index and stop.wait(round_pause_s):
            return
        yield replace(config, seed=config.seed + index)
        index += 1


def api_root(base_url: str) -> str:
    """The OpenAI API root of a server URL (`http://host:8000` or `http://host:8000/v1`)."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def served_model(client: httpx.Client) -> str:
    """The first model the server lists (`GET /v1/models`)."""
    response = client.get("models")
    response.raise_for_status()
    models = response.json().get("data") or []
    if not models:
        raise ValueError(f"{client.base_url} serves no model (GET /v1/models is empty)")
    return models[0]["id"]


def session_plan(seed: int, index: int) -> tuple[str, AgentKind, random.Random]:
    rng = random.Random(f"{seed}:{index}")
    kind = KINDS[index % len(KINDS)]
    return f"{kind.name}-{seed}-{index:04d}", kind, rng


def session_ids(config: WorkloadConfig) -> list[str]:
    """The ids of the sessions a round of `config` runs (`session_plan`'s): what a round's summary counts."""
    return [session_plan(config.seed, index)[0] for index in range(config.sessions)]


def first_messages(kind: AgentKind, rng: random.Random) -> list[dict]:
    """A session's opening messages: the shared system prompt with the agent's instructions, and its task."""
    return [
        {"role": "system", "content": SHARED_SYSTEM + kind.instructions},
        {"role": "user", "content": f"Plan {rng.choice(TASKS)} for customer {rng.randint(1000, 9999)}."},
    ]


def measure_first_steps(base_url: str, concurrency: int, max_tokens: int, *, model: str | None = None) -> Measurement:
    """Send `concurrency` sessions' opening requests at once, as a round's first steps are sent (what
    `kvobs.agent.calibrate.fit_workload` fits the deadline to): no session id, so they belong to no session the pages
    show."""
    with httpx.Client(base_url=api_root(base_url), timeout=PROBE_TIMEOUT_S) as client:
        name = model or served_model(client)

        def one(index: int) -> tuple[float, int]:
            messages = first_messages(KINDS[index % len(KINDS)], random.Random(f"probe:{index}"))
            body = {"model": name, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}
            started = time.monotonic()
            response = client.post("chat/completions", json={**body, "temperature": 0})
            response.raise_for_status()
            return time.monotonic() - started, int(response.json()["usage"]["prompt_tokens"])

        with ThreadPoolExecutor(concurrency) as pool:
            slowest_s, prompt_tokens = max(pool.map(one, range(concurrency)))
    return Measurement(concurrency, slowest_s, prompt_tokens, max_tokens)


def parse_json_reply(text: str) -> dict | None:
    """The JSON object in a reply (the outermost braces), or None."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        value = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def tool_result(rng: random.Random, tool: str) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
    return f"{tool} returned: {words}."


class Workload:
    """Runs `config.sessions` sessions, `config.concurrency` at a time, through `client` (one server) or a
    `StepRouter` over several (each step's request to the replica it picks)."""

    def __init__(
        self,
        config: WorkloadConfig,
        client: httpx.Client | StepRouter,
        *,
        tracer_provider: TracerProvider,
        recorder: StepRecorder | None = None,
        on_step=None,
        stop: threading.Event | None = None,
    ) -> None:
        self.config = config
        self.stop = stop or threading.Event()  # set: each session ends after its current step
        self.router = client if isinstance(client, StepRouter) else StepRouter([client])
        self.tracer_provider = tracer_provider
        self.recorder = recorder
        self.on_step = on_step or (lambda step: None)
        self.model = config.model or served_model(self.router.clients[0])
        self.result = WorkloadResult()
        self._lock = threading.Lock()

    def run(self) -> WorkloadResult:
        start = time.perf_counter()
        with ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="agent") as pool:
            for future in [pool.submit(self.run_session, i) for i in range(self.config.sessions)]:
                future.result()
        self.result.wall_s = time.perf_counter() - start
        return self.result

    def run_session(self, index: int) -> None:
        if self.stop.is_set():
            return
        session_id, kind, rng = session_plan(self.config.seed, index)
        messages = first_messages(kind, rng)
        with AgentSession(
            kind.name, session_id=session_id, tracer_provider=self.tracer_provider, recorder=self.recorder
        ) as session:
            for _ in range(self.config.steps):
                if self.stop.is_set():
                    break
                pause_s, tool = self.config.tool_pause.sample_s(rng), rng.choice(kind.tools)
                result = tool_result(rng, tool)
                try:
                    with session.step(deadline_s=self.config.step_deadline_s) as step:
                        reply = self._think(step, kind, messages, self.router.pick(session_id))
                        with step.tool(tool):
                            time.sleep(pause_s)
                except ChatError:
                    reply = None  # the step failed and is recorded; the agent goes on with what it has
                if reply is not None:
                    messages.append({"role": "assistant", "content": reply})
                messages.append({"role": "user", "content": result})
                self._count(step)
        with self._lock:
            self.result.sessions += 1

    def _think(self, step: AgentStep, kind: AgentKind, messages: list[dict], client: httpx.Client) -> str:
        reply = step.chat(
            client, model=self.model, messages=messages, max_tokens=self.config.max_tokens, temperature=0.0
        )
        if kind.requires_json and parse_json_reply(reply.text) is None:
            step.fail(StepErrorType.INVALID_RESPONSE.value, f"the reply is not a JSON object: {reply.text[:120]!r}")
        return reply.text

    def _count(self, step: AgentStep) -> None:
        with self._lock:
            self.result.steps += 1
            if step.error_type is not None:
                self.result.failed[step.error_type] += 1
        self.on_step(step)
