"""The recorded framework-agent runs that hold the server's KV events too (`kv_events.jsonl` beside the OTLP
exports, `kv_truth.json` the engine's own count of each session's losses): replayed through the collector's parts
(span ingest, the step maker, the KV stream's ingest and ownership by inference) on every backend, on the stream's
own clock. No block names a session, yet each session's losses and its losses in tool pauses come out as the
engine counted them."""

from __future__ import annotations

import base64
import json

import msgspec
import pytest

from collectors.block_owners import BlockOwners
from collectors.capture import span_bounds
from collectors.kv.ingest import KVIngest
from collectors.session_activity import SessionActivity
from collectors.traces.span_ingest import SpanIngest
from collectors.traces.span_steps import JOIN_WAIT_S, SpanSteps
from kvobs.block_events import Batch, Stored
from kvobs.store.writer import StoreWriter
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode
from tests.collectors.agent_harness import FIXTURES
from tests.collectors.test_agent_fixtures import exports

KV_RECORDINGS = sorted(p.name for p in FIXTURES.iterdir() if (p / "kv_truth.json").exists())


def kv_messages(name: str) -> list[tuple[float, int, Batch]]:
    out = []
    for line in (FIXTURES / name / "kv_events.jsonl").read_text().splitlines():
        message = json.loads(line)
        frames = [base64.b64decode(f) for f in message["frames_b64"]]
        out.append((message["recv_ts"], wire.seq_from_bytes(frames[-2]), decode(frames[-1]).batch))
    return out


def unnamed(batch: Batch) -> Batch:
    """The batch with no session on its stores (as a server that got no header sends it)."""
    events = [msgspec.structs.replace(e, session_id=None) if type(e) is Stored else e for e in batch.events]
    return msgspec.structs.replace(batch, events=events)


def replay(store, name: str, *, without_sessions: bool = True) -> BlockOwners:
    """The exports and KV messages in the order they arrived (an export when its latest span ended), each part of
    the collector run after each one, as its tick does, on the stream's clock; then stopped."""
    now = [0.0]

    def clock() -> float:
        return now[0]

    writer = StoreWriter(store)
    activity = SessionActivity(clock=clock)
    steps = SpanSteps(writer, activity=activity, step_counts=store.lookups.session_step_counts, clock=clock)
    ingest = KVIngest(
        writer,
        instance="engine",
        activity=activity,
        settle_s=1.0,
        verdict_wait_s=1.0 + JOIN_WAIT_S,  # as the collector gives it
        session_ends=store.lookups.session_ends,
        clock=clock,
    )
    owners = BlockOwners(activity, [ingest], clock=clock)
    spans = SpanIngest(writer, activity=activity, steps=steps, owners=owners, instance="engine")
    arrivals = [(ts, i, "kv", message) for i, (ts, *message) in enumerate(kv_messages(name))]
    arrivals += [(span_bounds(r)[1], i, "otlp", r) for i, r in enumerate(exports(name))]
    for ts, _, kind, item in sorted(arrivals, key=lambda a: (a[0], a[2], a[1])):
        now[0] = max(now[0], ts)
        if kind == "kv":
            seq, batch = item
            ingest.on_batch(seq, unnamed(batch) if without_sessions else batch)
        else:
            spans.handle(item)
        steps.settle()
        owners.run()
        ingest.snapshot()
    steps.settle(final=True)
    owners.run(final=True)
    ingest.snapshot(final=True)
    writer.close()
    return owners


def losses(store, sessions) -> dict:
    """Each session's losses and losses in tool pauses, as its latest footprint tells them."""
    told = {}
    for session in sessions:
        latest = store.reads.session_snapshots(session).iloc[-1]
        lost, paused = int(latest["session_evicted_blocks"]), int(latest["session_evicted_idle_blocks"])
        told[session] = {"lost": lost, "lost_in_pause": paused}
    return told


def in_pause(mine, ts: float) -> bool:
    """Whether a loss at `ts` fell in a tool pause of the session whose requests are `mine` (sorted by arrival):
    after one request's end and before the next one's arrival."""
    gaps = zip(mine["finished_ts"].tolist()[:-1], mine["arrival_ts"].tolist()[1:])
    return any(end < ts < start for end, start in gaps)


def header_truth(store, sessions) -> dict:
    """Each session's losses, and those in its tool pauses, read off a store whose removals name their sessions (a
    header run): a removal is a pause loss where it fell between the end of one of the session's requests (joined
    by its steps) and the arrival of its next, as the engine's block manager would place it."""
    removed = store.reads.kv_events(kinds=["removed"])
    steps = store.reads.steps()
    requests = store.reads.requests()
    requests = requests.assign(
        session_id=requests["request_id"].map(dict(zip(steps["request_id"], steps["session_id"])))
    )
    told = {}
    for session in sessions:
        mine = requests[requests["session_id"] == session].sort_values("arrival_ts")
        times = removed.loc[removed["session_id"] == session, "ts"]
        paused = sum(in_pause(mine, ts) for ts in times)
        told[session] = {"lost": len(times), "lost_in_pause": int(paused)}
    return told


@pytest.mark.parametrize("name", KV_RECORDINGS)
def test_recorded_kv_events_are_owned_by_inference_on_every_backend(any_store, name):
    """Every request's blocks tied as live; each session's losses in tool pauses as the engine counted them, and
    its losses as the live collector counted them (a prefix two conversations prefilled at once is neither's). A
    run whose blocks named their sessions (`header`) is held to what the names say (`header_truth`)."""
    truth = json.loads((FIXTURES / name / "kv_truth.json").read_text())
    owners = replay(any_store, name)
    if truth["requests_tied"] is not None:
        assert dict(owners.requests_tied) == truth["requests_tied"]
    assert losses(any_store, truth["sessions"]) == truth["sessions"]


@pytest.mark.parametrize("name", [n for n in KV_RECORDINGS if "vllm" in n])
def test_a_header_run_replayed_with_its_names_counts_the_pause_losses_its_names_place(store, name):
    """The same run with the session names left on its blocks: a removal outside every request its session is known
    to have made yet stays open until the steps that join the requests around it can have come (the collector's
    join wait), so a loss in a tool pause is not taken for one outside any request because the next request's
    span came late."""
    truth = json.loads((FIXTURES / name / "kv_truth.json").read_text())
    replay(store, name, without_sessions=False)
    assert losses(store, truth["sessions"]) == truth["sessions"] == header_truth(store, truth["sessions"])
