"""The compiled ingest core (`collectors.kv.core`) against the pure Python: the same `kv_events` rows, column for
column, the same footprint snapshots and the same counts, on every recording of KV events (vLLM 0.32, its tiers, the
two fleets, SGLang, TensorRT-LLM polled and pushed through Dynamo's relay) and on randomized streams with clears and
publisher restarts; and a tier's chains and clock answering alike call for call, past their bounds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from collectors.capture import read_kv_messages
from collectors.kv.core import load
from collectors.kv.ingest import KVIngest
from kvobs.block_events import Batch, Cleared, Placeholder, Removed, Stored, UnknownTier
from kvobs.store.runs import as_list
from kvobs.trtllm.normalize import TrtllmAdapter
from kvobs.vllm.normalize import decode

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RESTART = None  # in a stream: the publisher restarted


class KeptRows:
    """A store writer that keeps what the ingest gives it (`RowWriter`)."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.snapshots: list = []
        self.sessions: list = []

    def add_many(self, records, *, wait_s: float = 0.0) -> None:
        self.events.append({name: as_list(column) for name, column in records.columns.items()})

    def add(self, record) -> None:
        self.snapshots.append(record)

    def insert_missing(self, record) -> None:
        self.sessions.append(record)


def _zmq_recording(path: Path) -> list[Batch]:
    return [decode(frames[-1]).batch for _, frames in read_kv_messages(path)]


def _frames(path: Path) -> list[Batch]:
    return [decode(bytes.fromhex(json.loads(line)["payload"])).batch for line in path.read_text().splitlines()]


def _trtllm_polls() -> list[Batch]:
    adapter = TrtllmAdapter()
    polls = json.loads((FIXTURES / "trtllm" / "kv_cache_events.json").read_text())
    return [adapter.decode(json.dumps(poll).encode(), ts=100.0 * (n + 1)).batch for n, poll in enumerate(polls)]


RECORDINGS = {
    "vllm-0.32-cpu": lambda: _zmq_recording(FIXTURES / "vllm-0.32-cpu" / "kv_events.jsonl"),
    "vllm-tiers": lambda: _frames(FIXTURES / "vllm-tiers" / "frames.jsonl"),
    "vllm-0.32-sessions": lambda: _frames(FIXTURES / "vllm-tiers" / "sessions.jsonl"),
    "fleet-vllm-cpu-a": lambda: _zmq_recording(FIXTURES / "fleet-vllm-cpu" / "replica-a" / "kv_events.jsonl"),
    "fleet-vllm-cpu-b": lambda: _zmq_recording(FIXTURES / "fleet-vllm-cpu" / "replica-b" / "kv_events.jsonl"),
    "fleet-kvobs-serve-a": lambda: _zmq_recording(FIXTURES / "fleet-kvobs-serve" / "replica-a" / "kv_events.jsonl"),
    "fleet-kvobs-serve-b": lambda: _zmq_recording(FIXTURES / "fleet-kvobs-serve" / "replica-b" / "kv_events.jsonl"),
    "sglang": lambda: _frames(FIXTURES / "sglang" / "frames.jsonl"),
    "trtllm-polled": _trtllm_polls,
    "trtllm-dynamo-relay": lambda: _frames(FIXTURES / "trtllm" / "dynamo_frames.jsonl"),
}


def ingested(stream: list, choice: str, snapshot_every: int = 7, hold_s: float = 0.0) -> tuple:
    """The stream (batches, `RESTART`s) through a KVIngest on the core `choice`, on a clock of its own (stream time):
    everything the ingest wrote and counted. `hold_s`: with ownership by inference on, its removals of blocks that
    named no session held that long (and adopted by no one: released as they were)."""
    now = [0.0]
    rows = KeptRows()
    ingest = KVIngest(rows, instance="r", core=load(choice), clock=lambda: now[0], settle_s=0.0)
    if hold_s:
        ingest.infer_owners(hold_s, recent_s=600.0)
    for n, batch in enumerate(stream):
        if batch is RESTART:
            ingest.on_restart()
            continue
        now[0] = max(now[0], batch.ts)
        ingest.on_batch(n, batch)
        if n % snapshot_every == 0:
            ingest.snapshot()
    ingest.snapshot(final=True)
    tiers = (ingest.chains, *ingest.tiers.values())
    footprints = [dict(tier.footprints) for tier in tiers]
    counts = (ingest.num_repeated_stores, ingest.num_unknown_removals, ingest.num_placeholders)
    counts += tuple(tier.resident() for tier in tiers)
    return rows.events, rows.snapshots, rows.sessions, footprints, counts


def _same(stream: list, hold_s: float = 0.0) -> None:
    python, compiled = ingested(stream, "python", hold_s=hold_s), ingested(stream, "compiled", hold_s=hold_s)
    for name, a, b in zip(("rows", "snapshots", "sessions", "footprints", "counts"), python, compiled):
        assert a == b, f"the compiled core's {name} differ from the pure Python's"


@pytest.mark.parametrize("recording", sorted(RECORDINGS))
def test_the_compiled_core_writes_what_the_python_does_on_every_recording(recording, compiled_kv_core):
    stream = RECORDINGS[recording]()
    assert stream and any(type(e) is Stored for batch in stream for e in batch.events)
    _same(stream)
    _same([*stream[: len(stream) // 2], RESTART, *stream[len(stream) // 2 :]])  # a restart half-way


def random_stream(seed: int, batches: int = 400) -> list:
    """Stores that extend, share and repeat chains (several sessions, none, two tiers, two groups), removals of
    blocks resident, gone and never seen (lost and released), placeholders, unknown tiers, clears and restarts."""
    rng = random.Random(seed)
    pool = [rng.getrandbits(64) for _ in range(300)]  # (a small pool: blocks come back, are shared, repeat)
    sessions = [None, "s1", "s2", "s3", "a-much-longer-session-id"]
    stream: list = []
    ts = 1.8e9
    for _ in range(batches):
        ts += rng.choice([0.01, 0.5, 30.0, 4000.0])  # (past the clock's horizon now and then)
        events: list = []
        for _ in range(rng.randint(1, 5)):
            medium, group = rng.choice([(None, None), ("GPU", 0), ("CPU", None), ("GPU", 1)])
            roll = rng.random()
            hashes = rng.sample(pool, rng.randint(1, 6))
            if roll < 0.45:
                parent = rng.choice([None, rng.choice(pool)])
                events.append(Stored(hashes, parent, 16, medium, group, rng.choice(sessions)))
            elif roll < 0.8:
                events.append(Removed(hashes, medium, group, rng.choice([None, "finished", "preempted"])))
            elif roll < 0.86:
                events.append(Placeholder(hashes, "CPU"))
            elif roll < 0.9:
                events.append(UnknownTier(hashes, "TAPE"))
            elif roll < 0.93:
                events.append(Cleared())
            else:
                events.append(Stored(hashes, None, 16, medium, group, rng.choice(sessions), first_tokens=[1, 2, 3]))
        stream.append(Batch(ts, events))
        if rng.random() < 0.02:
            stream.append(RESTART)
    return stream


@pytest.mark.parametrize("seed", range(6))
def test_the_compiled_core_writes_what_the_python_does_on_random_streams_with_restarts(seed, compiled_kv_core):
    stream = random_stream(seed)
    _same(stream)
    if seed < 2:  # and with the removals of blocks that named no session held for ownership by inference
        held = ingested(stream, "compiled", hold_s=60.0)[0]
        assert held != ingested(stream, "compiled")[0]  # (the holding path was taken)
        _same(stream, hold_s=60.0)


def _calls(seed: int, n: int = 3000) -> list[tuple]:
    """A tier's chains called as KVIngest and a restart's rebuild call them, and as ownership by inference adopts."""
    rng = random.Random(seed)
    pool = list(range(1, 400))
    sessions = [None, "a", "b", "c"]
    calls, ts = [], 100.0
    for _ in range(n):
        ts += rng.choice([0.1, 1.0, 20.0, 70.0])
        roll, hashes = rng.random(), rng.sample(pool, rng.randint(0, 5))
        if roll < 0.04 and hashes:
            hashes = [hashes[0], *hashes]  # a hash twice in one store, as no engine sends but a wire may
        if roll < 0.45:
            calls.append(("store", hashes, rng.choice([None, rng.choice(pool)]), rng.choice(sessions), ts))
        elif roll < 0.8:
            calls.append(("remove", hashes, rng.random() < 0.8, ts))
        elif roll < 0.86:
            calls.append(("adopt", rng.choice(pool), rng.choice(sessions[1:])))
        elif roll < 0.9:
            calls.append(("block", rng.choice(pool)))
        elif roll < 0.93:
            calls.append(("cleared", ts))
        elif roll < 0.97:
            calls.append(("clock_stored", hashes, ts))  # (a rebuild's history)
        else:
            calls.append(("clock_lost", hashes, ts))
    return calls


def _answers(core, calls: list[tuple]) -> list:
    chains = core.new_chains(max_blocks=60, clock=core.new_clock(max_blocks=40, horizon_s=150.0))
    out = []
    for name, *args in calls:
        if name == "clock_stored":
            out.append(chains.clock.stored(*args))
        elif name == "clock_lost":
            out.append(chains.clock.lost(*args))
        else:
            out.append(getattr(chains, name)(*args))
        clock = (len(chains.clock.stored_at), len(chains.clock.lost_at))
        counts = (chains.num_repeated, chains.num_unknown_removed)
        out.append((chains.resident(), *clock, *counts, dict(chains.footprints)))
    parents = chains.parents()
    out.append((chains.hashes(), [parents[h] for h in chains.hashes()], len(parents), 5 in parents))
    out.append((chains.clock.stored_at, chains.clock.lost_at))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_a_tiers_compiled_chains_and_clock_answer_what_the_python_does_call_for_call(seed, compiled_kv_core):
    """Past every bound (60 blocks, 40 clock entries, a horizon of 150 s), with adoption, clears and a rebuild's
    stores and losses: each call's answer and the counts after it."""
    calls = _calls(seed)
    python, compiled = _answers(load("python"), calls), _answers(compiled_kv_core, calls)
    assert len(python) == len(compiled) == 2 * len(calls) + 2
    for n, (a, b) in enumerate(zip(python, compiled)):
        assert a == b, f"answer {n} ({calls[n // 2] if n // 2 < len(calls) else 'the end'}) differs"
    counts = python[1:-2:2]
    assert max(c[0] for c in counts) >= 59 and max(c[2] for c in counts) >= 39  # (the bounds were reached)
