"""Stores built from real runs, once per test session (SQLite files), for analytics, alerts, what-if and dashboard:

- `agent_run`: our engine (real SmolLM2, 30 blocks of 16 tokens, so sessions evict each other, get preempted and
  time out) under the `kvobs agents` workload: 6 sessions, 3 at a time, 3 steps, 0.2-0.6 s tool pauses.
- `vllm_run`: the recorded vLLM 0.32 run (tests/fixtures/vllm-0.32-cpu) ingested by the collector.
- `fleet_run`: the same recording as a fleet of two replicas behind one collector (`vllm-a` plays all of it,
  `vllm-b` its second half and then goes down; requests dealt out between them).
- `served_fleet`: two `kvobs serve` replicas under `kvobs agents --routing round_robin`, recorded
  (tests/fixtures/fleet-kvobs-serve) and ingested by one collector; its truth: each request's routing loss.
- `vllm_fleet`: two real vLLM servers (CPU build) under `kvobs agents --routing round_robin`, recorded
  (tests/fixtures/fleet-vllm-cpu) and ingested by one collector; its truth: vLLM's own cached tokens per request.
- `measured_copy(run, dir)`: a copy of a run's store whose request lookups a collector's routing meter measured.
- `overload`: the real engine on a virtual clock (`tests.analytics.scripted`), one request at a time, with steps that
  time out in the queue, never scheduled; its truth is exact (the whole-step verdicts, the timed-out step's story).
- `two_runs`: our engine started twice under one instance name into one store (as `kvobs demo` run twice into
  the default `kvobs.db`), a round of the workload each; `result.rounds` holds each round's (start, end).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import pandas as pd
import pytest
from opentelemetry.sdk.trace import TracerProvider

from kvobs.agent.recorder import StoreStepRecorder
from kvobs.agent.workload import PauseDistribution, Workload, WorkloadConfig, WorkloadResult
from kvobs.store import StoreWriter, open_store
from kvobs.store.interface import Store

NUM_BLOCKS = 30
OVERLOAD_DEADLINE_S = 1.0
TOOL_S = 0.3


@dataclass
class Run:
    url: str
    store: Store
    result: WorkloadResult | None = None
    engine_counts: EngineCounts | None = None  # the engine's own events, for runs of our engine


@dataclass
class EngineCounts:
    """What the block manager itself said, per request, in time order: each prefix lookup's blocks hit and each
    allocation's blocks (an observer on the engine thread, beside the store's)."""

    hits: list[tuple[float, str, int]] = field(default_factory=list)  # (ts, request_id, hit_blocks)
    allocations: list[tuple[float, str, int]] = field(default_factory=list)  # (ts, request_id, blocks)

    def on_step(self, result) -> None:
        for event in result.events:
            if event.kind == "prefix_lookup":
                self.hits.append((event.ts, event.request_id, event.hit_blocks))
            elif event.kind == "allocated":
                self.allocations.append((event.ts, event.request_id, len(event.block_ids)))


@pytest.fixture(scope="session")
def agent_run(smollm2_source, tmp_path_factory) -> Run:
    from tests.server.conftest import running_server

    url = f"sqlite:///{tmp_path_factory.mktemp('agent-run') / 'kvobs.db'}"
    options = {"store_url": url, "snapshot_interval_s": 0.5, "instance": "engine-test"}
    counts = EngineCounts()
    with running_server(smollm2_source, options=options, num_blocks=NUM_BLOCKS, max_model_len=448) as server:
        server.engine.observers.append(counts)
        store = open_store(url)
        result = sdk_workload(server, store, sessions=6, concurrency=3, steps=3)
    return Run(url, store, result, counts)


def sdk_workload(server, store: Store, **config) -> WorkloadResult:
    """The agent SDK's sessions against `server` (16-token replies, 0.2-0.6 s tool pauses, a 30 s deadline unless
    `config` says otherwise), their steps recorded into `store` as `StoreStepRecorder` writes them."""
    writer = StoreWriter(store)
    defaults = {"max_tokens": 16, "seed": 1, "tool_pause": PauseDistribution.parse("uniform:200-600")}
    settings = WorkloadConfig(base_url=server.url, **{"step_deadline_s": 30.0, **defaults, **config})
    with httpx.Client(base_url=server.url + "/v1", timeout=60) as client:
        result = Workload(settings, client, tracer_provider=TracerProvider(), recorder=StoreStepRecorder(writer)).run()
    writer.close()
    return result


def _collected(tmp_path_factory, name: str, collect) -> Run:
    """A SQLite store filled by `collect(store)`, a context manager that runs a collector over a recording."""
    url = f"sqlite:///{tmp_path_factory.mktemp(name) / 'kvobs.db'}"
    store = open_store(url)
    with collect(store):
        pass
    return Run(url, store)


@pytest.fixture(scope="session")
def vllm_run(tmp_path_factory) -> Run:
    from tests.collectors.recorded_run import collect_recorded

    return _collected(tmp_path_factory, "vllm-run", collect_recorded)


FLEET = ("vllm-a", "vllm-b")


@pytest.fixture(scope="session")
def fleet_run(tmp_path_factory) -> Run:
    from tests.collectors.recorded_run import collect_recorded

    return _collected(tmp_path_factory, "fleet-run", lambda store: collect_recorded(store, replicas=FLEET))


@pytest.fixture(scope="session")
def served_fleet(tmp_path_factory) -> Run:
    from tests.collectors.fleet_recording import collect_fleet_recording

    return _collected(tmp_path_factory, "served-fleet", collect_fleet_recording)


@pytest.fixture(scope="session")
def vllm_fleet(tmp_path_factory) -> Run:
    from tests.collectors.fleet_recording import VLLM_FLEET, collect_fleet_recording

    return _collected(tmp_path_factory, "vllm-fleet", lambda store: collect_fleet_recording(store, VLLM_FLEET))


def missing_as_none(column) -> list:
    """A column's values with NaN and pandas' NA as None: what two frames of lookups are compared by."""
    return [None if pd.isna(v) else v for v in column.astype(object)]


def drive_meter(meter, store: Store, *, step_s: float = 30.0, until: float | None = None) -> None:
    """Run a routing meter over `store`'s recorded time as a collector's tick would, every `step_s`, until it has
    measured up to `until` (the store's end by default); its first run warms its index up to just before the first
    lookup."""
    first, last = store.reads.time_range()
    now = first + meter.delay_s + meter.request_s - 1.0
    while meter.done is None or meter.done < (last if until is None else until):
        meter.run(now)
        now += step_s


def measured_copy(run: Run, directory, *, until: float | None = None, meter=None) -> Store:
    """A copy of `run`'s SQLite store whose request lookups a routing meter measured, as a collector does a minute
    at a time, up to `until` (the end of the run by default). `meter`: store -> the meter to run (by default one
    over every instance, writing through a `StoreWriter` of the copy)."""
    import sqlite3

    from collectors.jobs.routing_meter import RoutingMeter

    path = directory / "measured.db"
    with sqlite3.connect(run.url.removeprefix("sqlite:///")) as source, sqlite3.connect(path) as copy:
        source.backup(copy)  # (the file alone may lack what its write-ahead log holds)
    store = open_store(f"sqlite:///{path}")
    writer = StoreWriter(store) if meter is None else None
    if meter is None:
        meter = RoutingMeter(store, store.reads.instances(), write=writer.add_many, progress=writer.upsert)
    else:
        meter = meter(store)
    drive_meter(meter, store, until=until)
    if writer is not None:
        writer.close()
    return store


TWO_RUNS_INSTANCE = "engine-twice"


@dataclass
class TwoRuns:
    url: str
    store: Store
    rounds: list[tuple[float, float]]  # each engine run's workload: (start, end), epoch s


@pytest.fixture(scope="session")
def two_runs(smollm2_source, tmp_path_factory) -> TwoRuns:
    from tests.server.conftest import running_server

    url = f"sqlite:///{tmp_path_factory.mktemp('two-runs') / 'kvobs.db'}"
    rounds = []
    for seed in (1, 2):  # two engine starts: each begins with an empty cache
        options = {"store_url": url, "snapshot_interval_s": 0.5, "instance": TWO_RUNS_INSTANCE}
        with running_server(smollm2_source, options=options, num_blocks=NUM_BLOCKS, max_model_len=448) as server:
            store = open_store(url)
            writer = StoreWriter(store)
            config = WorkloadConfig(
                base_url=server.url,
                sessions=4,
                concurrency=2,
                steps=2,
                max_tokens=12,
                seed=seed,
                tool_pause=PauseDistribution.parse("uniform:200-500"),
                step_deadline_s=30.0,
            )
            started = time.time()
            with httpx.Client(base_url=server.url + "/v1", timeout=60) as client:
                Workload(config, client, tracer_provider=TracerProvider(), recorder=StoreStepRecorder(writer)).run()
            writer.close()
            store.close()
        rounds.append((started, time.time()))
        time.sleep(3.0)  # the engine is down a while before it starts again: a gap nothing watched
    return TwoRuns(url, open_store(url), rounds)


@pytest.fixture(scope="session")
def overload(smollm2_source, tmp_path_factory):
    """(script, store): the real engine on a virtual clock (`tests.analytics.scripted`), one request at a time: a long
    reply holds it while two sessions' next steps arrive with a 1 s deadline; they are never scheduled, their
    clients hang up at the deadline and the engine aborts them; the long reply's growth evicted their prefixes."""
    from tests.analytics.scripted import Script, tokens_of

    s = Script.start(
        smollm2_source, tmp_path_factory.mktemp("overload") / "run.db", num_blocks=24, max_num_seqs=1, max_model_len=320
    )
    contexts = {}
    for n, session in enumerate(["long", "q1", "q2"]):  # each session's usual step, one after another
        rid = s.send(session, 0, tokens_of(n, 96), 4, tool_s=TOOL_S)
        s.finish()
        s.idle(TOOL_S + 0.05)
        contexts[session] = s.context(rid) + tokens_of(n + 10, 16)
    s.send("long", 1, contexts["long"], 150, tool_s=TOOL_S)  # a long reply holds the one running slot
    for _ in range(100):  # and grows, evicting the idle sessions' cached prefixes before they come back
        s.step()
    for session in ("q1", "q2"):
        s.send(session, 1, contexts[session], 4, deadline_s=OVERLOAD_DEADLINE_S)
    s.finish()
    return s, s.close()


UNREACHED_DEADLINE_S = 3.0  # `unreached`: every step's deadline
UNREACHED_REACHED_S = 2.2  # a's third step: its request's arrival, from the step's start


def good_step(s, session: str, index: int, context: list[int]) -> list[int]:
    """A scripted step that succeeds, then its tool pause; the next step's context."""
    from tests.analytics.scripted import tokens_of

    rid = s.send(session, index, context, 8, deadline_s=UNREACHED_DEADLINE_S, tool_s=TOOL_S)
    s.finish()
    s.idle(TOOL_S + 0.05)
    return s.context(rid) + tokens_of(5 + index, 16)


@pytest.fixture(scope="session")
def unreached(smollm2_source, tmp_path_factory):
    """(script, store): sessions a, b and d take turns on the real engine on a virtual clock, each step with a 3 s
    deadline. a's third step's request reaches the server 2.2 s into the step and the machine slows while it
    prefills: the deadline passes before its first token and the engine aborts it (an `abort` row: this server
    records what its clients abandon). b's second step's request never reaches the server, and b's third does, after
    it. d's last step never reaches it either, and nothing is heard from the server after it."""
    from tests.analytics.scripted import Script, tokens_of

    path = tmp_path_factory.mktemp("unreached") / "run.db"
    s = Script.start(smollm2_source, path, num_blocks=128, max_num_seqs=2)
    a, b, d = tokens_of(0, 64), tokens_of(1, 64), tokens_of(2, 64)
    for index in range(2):
        a = good_step(s, "a", index, a)
    b = good_step(s, "b", 0, b)
    d = good_step(s, "d", 0, d)
    s.send("a", 2, a, 200, deadline_s=UNREACHED_DEADLINE_S, client_s=UNREACHED_REACHED_S)
    s.clock.slow = 8.0  # the machine slows while it prefills: the deadline passes before the first token
    s.finish()
    s.clock.slow = 1.0
    s.idle(TOOL_S)
    s.unsent("b", 1, UNREACHED_DEADLINE_S)
    good_step(s, "b", 2, b)
    s.unsent("d", 1, UNREACHED_DEADLINE_S)  # the run's last step: the server is not heard after it
    return s, s.close()


def conversation(url: str, session: str, writer, *, stamped: bool) -> None:
    """Four turns of one conversation, each call resending the whole of it, as an agent does, each recorded as a step
    the way the SDK writes one; `stamped`: the system prompt opens with the time of the call, as some clients put
    it."""
    from kvobs.store.rows import StepRecord

    system = "You are a travel assistant. Answer in one short sentence about trains, flights and hotels."
    history: list[dict] = []
    for turn in range(4):
        opening = f"Now: 2026-12-04T10:{turn:02d}:{7 * turn:02d}Z. " if stamped else ""
        history.append({"role": "user", "content": f"Question {turn}: which city should I visit next and why?"})
        body = {
            "model": "smollm2",
            "messages": [{"role": "system", "content": opening + system}, *history],
            "max_tokens": 8,
            "temperature": 0,
        }
        started = time.time()
        reply = httpx.post(url + "/v1/chat/completions", json=body, headers={"X-Session-ID": session}, timeout=60)
        assert reply.status_code == 200, reply.text
        answer, usage = reply.json()["choices"][0]["message"]["content"], reply.json()["usage"]
        history.append({"role": "assistant", "content": answer})
        ended = time.time()
        writer.add(
            StepRecord(
                session_id=session,
                step_index=turn,
                started_at=started,
                ended_at=ended,
                status="ok",
                e2e_s=ended - started,
                prompt_tokens=usage["prompt_tokens"],
                cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                completion_tokens=usage["completion_tokens"],
            )
        )


@pytest.fixture(scope="session")
def changing_start_run(smollm2_source, tmp_path_factory) -> Run:
    """Two four-turn conversations on a real server with room for both, each turn a step as the SDK writes one:
    `stamped`, whose system prompt opens with the time of each call, and `steady`, the same without it."""
    from tests.server.conftest import running_server

    url = f"sqlite:///{tmp_path_factory.mktemp('changing-start') / 'kvobs.db'}"
    store = open_store(url)
    writer = StoreWriter(store)
    with running_server(smollm2_source, options={"store_url": url, "instance": "starts"}, num_blocks=256) as server:
        conversation(server.url, "stamped", writer, stamped=True)
        conversation(server.url, "steady", writer, stamped=False)
    writer.close()
    return Run(url, store)
