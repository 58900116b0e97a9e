"""What the recorded run holds, computed straight from the fixture files (generic msgpack and protobuf decoding,
plain dicts), to compare with what the collector stored."""

from __future__ import annotations

from collections import Counter, defaultdict

import msgspec
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.collectors.recorded import agent_steps, kv_messages, otlp_bodies


def batches() -> list[tuple[float, list[dict]]]:
    return [tuple(msgspec.msgpack.decode(m.frames[2])[:2]) for m in kv_messages()]


def llm_request_spans() -> list:
    spans = []
    for body in otlp_bodies():
        request = ExportTraceServiceRequest.FromString(body)
        spans += [
            s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans if s.name == "llm_request"
        ]
    return spans


def request_intervals() -> dict[str, list[tuple[float, float]]]:
    """session -> [(span start, span end)] through the agent steps' trace ids."""
    session_of = {s["trace_id"]: s["session"] for s in agent_steps()}
    out: dict[str, list] = defaultdict(list)
    for span in llm_request_spans():
        session = session_of.get(span.trace_id.hex())
        if session is not None:
            out[session].append((span.start_time_unix_nano / 1e9, span.end_time_unix_nano / 1e9))
    return out


def kv_outcome() -> dict:
    """Rows per (kind, session), final resident blocks, blocks lost, blocks each reset dropped, and per session the
    removals while it was idle,
    by hindsight from the request spans: `pause` (a later request of the session exists) or `after_end` (none:
    every recorded session ended after its last step, as the agent SDK records)."""
    owners: dict[int, set] = {}
    rows: Counter = Counter()
    lost: Counter = Counter()
    pause: Counter = Counter()
    after_end: Counter = Counter()
    cleared_blocks: list[int] = []
    intervals = request_intervals()
    for ts, events in batches():
        for e in events:
            if e["type"] == "BlockStored":
                for h in e["block_hashes"]:
                    owners.setdefault(h, set()).add(e["session_id"])
                    rows[("stored", e["session_id"])] += 1
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    for s in owners.pop(h, {None}):
                        rows[("removed", s)] += 1
                        lost[s] += 1
                        spans = intervals.get(s, [])
                        if spans and ts >= min(a for a, _ in spans) and not any(a <= ts <= b for a, b in spans):
                            (pause if any(a > ts for a, _ in spans) else after_end)[s] += 1
            elif e["type"] == "AllBlocksCleared":
                rows[("cleared", None)] += 1
                cleared_blocks.append(len(owners))  # each resident block once, however many sessions owned it
                for sessions in owners.values():
                    for s in sessions:
                        lost[s] += 1
                owners.clear()
    resident = Counter(s for sessions in owners.values() for s in sessions)
    return {
        "rows": rows,
        "resident": resident,
        "lost": lost,
        "pause": pause,
        "after_end": after_end,
        "cleared_blocks": cleared_blocks,
    }
