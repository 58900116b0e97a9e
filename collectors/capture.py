"""A recorded capture replayed through the collector's own parts into a store, on the capture's own clock.

    summary = import_capture(store, Path("capture"))   # kvobs import capture --store sqlite:///kvobs.db

A capture is what a collector would have received, written as it came (the layout the fixture recorders write):

    kv_events.jsonl      one KV-event ZMQ message a line: `recv_ts` and its frames, base64 (`frames_b64`)
    metrics/             `GET /metrics` bodies; `index.json` lists each file with the time it was scraped
    otlp_traces.jsonl    one OTLP export body a line (protobuf `ExportTraceServiceRequest`, base64 `body_b64`)
    agent_steps.json     optional: the agent's own record of its steps (session, step, trace_id, span_id, start,
                         end, ok, usage), stored as the agent SDK's recorder stores them

One replica's files at the top, named by `instance` (default: the folder's name); or a folder per replica holding its
`kv_events.jsonl` and `metrics/`, named by the folder, the OTLP exports at the top. Every message goes through the
same code the live collector runs (the subscriber's sequence checks, the scraper's reading of a body, the span
ingest), in the order of the times it was recorded at, with the collector's jobs run as its tick would; nothing
is sent over a socket. The what-if benchmark builds its stores from the project's recordings this way.
"""

from __future__ import annotations

import base64
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from collectors.kv.subscriber import KVEventSubscriber
from kvobs.commands.doctor import exposition_checks
from kvobs.semconv.spans import SessionSource
from kvobs.store import Store, StoreWriter
from kvobs.store.rows import SessionRecord, StepRecord

log = logging.getLogger(__name__)

KV_EVENTS, METRICS, OTLP, AGENT_STEPS = "kv_events.jsonl", "metrics", "otlp_traces.jsonl", "agent_steps.json"
SCRAPE, KV, SPANS = 0, 1, 2  # order of what was recorded at the same time


class CaptureError(ValueError):
    """The folder holds no capture, or a file of it cannot be read."""


@dataclass
class CaptureSummary:
    """What an import read: per replica its KV-event messages and scrapes, and the exports and agent steps."""

    replicas: dict[str, dict[str, int]] = field(default_factory=dict)
    exports: int = 0
    agent_steps: int = 0
    checks: list[tuple[str, bool, str]] = field(default_factory=list)  # `kvobs doctor --collector`'s, of the import

    def describe(self) -> str:
        counts = self.replicas.items()
        parts = [f"{r}: {n['kv_messages']} KV-event messages, {n['scrapes']} scrapes" for r, n in counts]
        return "; ".join([*parts, f"{self.exports} OTLP exports", f"{self.agent_steps} agent steps"])


@dataclass(frozen=True)
class Replica:
    name: str
    folder: Path

    @property
    def has_kv(self) -> bool:
        return (self.folder / KV_EVENTS).exists()

    @property
    def has_metrics(self) -> bool:
        return (self.folder / METRICS / "index.json").exists()


def replicas_of(root: Path, instance: str | None = None) -> list[Replica]:
    """The capture's replicas: the top folder itself when it holds a replica's files, else each folder under it that
    does (by name)."""
    top = Replica(instance or root.name, root)
    if top.has_kv or top.has_metrics:
        return [top]
    found = [Replica(p.name, p) for p in sorted(root.iterdir()) if p.is_dir()]
    found = [r for r in found if r.has_kv or r.has_metrics]
    if not found and not (root / OTLP).exists():
        files = f"{KV_EVENTS}, {METRICS}/index.json or {OTLP}"
        raise CaptureError(f"{root} holds no capture: no {files} in it or its folders")
    return found


def import_capture(store: Store, root: Path, *, instance: str | None = None) -> CaptureSummary:
    """Replay the capture in `root` into `store` (see the module's doc); returns what was read."""
    root = Path(root)
    if not root.is_dir():
        raise CaptureError(f"{root} is not a folder")
    replicas = replicas_of(root, instance)
    summary = CaptureSummary(exports=0)
    arrivals: list[tuple[float, int, int, str, object]] = []
    for replica in replicas:
        messages = read_kv_messages(replica.folder / KV_EVENTS) if replica.has_kv else []
        scrapes = read_scrapes(replica.folder / METRICS) if replica.has_metrics else []
        summary.replicas[replica.name] = {"kv_messages": len(messages), "scrapes": len(scrapes)}
        arrivals += [(ts, KV, i, replica.name, frames) for i, (ts, frames) in enumerate(messages)]
        arrivals += [(ts, SCRAPE, i, replica.name, body) for i, (ts, body) in enumerate(scrapes)]
    exports = _exports(root / OTLP) if (root / OTLP).exists() else []
    summary.exports = len(exports)
    arrivals += [(ts, SPANS, i, "", export) for i, (ts, export) in enumerate(exports)]
    if (root / AGENT_STEPS).exists():
        summary.agent_steps = store_agent_steps(store, json.loads((root / AGENT_STEPS).read_text()))
    arrivals.sort(key=lambda a: a[:3])
    summary.checks = exposition_checks(_replay(store, replicas, arrivals, single=len(replicas) == 1))
    log.info("imported %s: %s", root, summary.describe())
    return summary


def _replay(store: Store, replicas: list[Replica], arrivals: list, *, single: bool) -> str:
    """Each arrival handed to the collector's part that takes it live; returns the collector's own /metrics text."""
    now = [arrivals[0][0] if arrivals else 0.0]
    with_kv = [r.name for r in replicas if r.has_kv]
    options = CollectorOptions(
        vllm_urls=[f"{r.name}=http://capture.invalid/{r.name}" for r in replicas if r.has_metrics],  # (never fetched)
        # (never connected: each recorded message is handed to its stream's subscriber)
        kv_events=[f"{name}=tcp://127.0.0.1:0" for name in with_kv],
        otlp_http="127.0.0.1:0",  # (never bound: the exports are handed to the span ingest)
        instance=replicas[0].name if single and replicas else None,
        workers=1,  # (the streams in this process: each message is handed to its subscriber here)
    )
    collector = Collector(options, store=store, clock=lambda: now[0])
    targets = {t.instance: t for t in collector.targets}
    # (a tcp:// stream's subscriber, in this process: `workers=1`)
    subscribers = {
        s.spec.instance: s.subscriber for s in collector.streams if isinstance(s.subscriber, KVEventSubscriber)
    }
    for subscriber in subscribers.values():  # a batch's lag as it was recorded: its receipt less its own time
        subscriber.clock = lambda: now[0]
    scraper = collector.scraper
    collector.leases.claim()
    last_tick = now[0]
    try:
        for ts, kind, _, name, item in arrivals:
            now[0] = max(now[0], ts)
            if kind == KV:
                subscribers[name].receive(item)
            elif kind == SCRAPE and scraper is not None:
                scraper.take(targets[name], item, ts)
            else:
                collector.export(item)
            if now[0] - last_tick >= options.interval_s:  # the collector's tick, on the capture's clock
                collector.writer.flush()  # (its jobs read the store: all of what came before is in it, as live)
                collector.tick(now[0])
                last_tick = now[0]
        collector.writer.flush()
        collector.tick(now[0])
    finally:
        collector.stop()
    return generate_latest(collector.registry).decode()


def store_agent_steps(store: Store, steps: list[dict]) -> int:
    """The agent's own record of its steps (`agent_steps.json`) stored as the agent SDK's recorder stores them: a
    step each, and each session's row ended at its last step's end (the record holds no later end)."""
    writer = StoreWriter(store)
    ended: dict[str, float] = {}
    for step in steps:
        usage = step.get("usage") or {}
        writer.add(
            StepRecord(
                session_id=step["session"],
                step_index=step["step"],
                trace_id=step.get("trace_id"),
                span_id=step.get("span_id"),
                started_at=step["start"],
                ended_at=step["end"],
                status="ok" if step["ok"] else "error",
                e2e_s=step["end"] - step["start"],
                error_type=None if step["ok"] else step.get("error_type"),
                prompt_tokens=usage.get("prompt_tokens"),
                cached_tokens=(usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
                completion_tokens=usage.get("completion_tokens"),
            )
        )
        ended[step["session"]] = max(ended.get(step["session"], 0.0), step["end"])
    for session, end in ended.items():
        writer.upsert(SessionRecord(session, source=SessionSource.SDK.value, ended_at=end))
    writer.close()
    return len(steps)


def read_kv_messages(path: Path) -> list[tuple[float, list[bytes]]]:
    """A `kv_events.jsonl`: each recorded ZMQ message, (when it was received, its frames)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            message = json.loads(line)
            out.append((float(message["recv_ts"]), [base64.b64decode(f) for f in message["frames_b64"]]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CaptureError(f"{path}:{n}: not a recorded KV-event message ({exc})") from exc
    return out


def read_scrapes(folder: Path) -> list[tuple[float, str]]:
    """A `metrics/` folder: each recorded `GET /metrics`, (when it was scraped, the body), in `index.json`'s order."""
    try:
        index = json.loads((folder / "index.json").read_text())
        return [(float(entry["ts"]), (folder / entry["file"]).read_text()) for entry in index]
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise CaptureError(f"{folder}/index.json: not a list of recorded scrapes ({exc})") from exc


def read_export_bodies(path: Path) -> list[bytes]:
    """An `otlp_traces.jsonl`: each recorded OTLP export's body, in the order it was received."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            out.append(base64.b64decode(json.loads(line)["body_b64"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise CaptureError(f"{path}:{n}: not a recorded OTLP export ({exc})") from exc
    return out


def span_bounds(export: ExportTraceServiceRequest) -> tuple[float, float]:
    """(its earliest span's start, its latest span's end), epoch seconds; (0, 0) for an export of no span."""
    spans = [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]
    if not spans:
        return 0.0, 0.0
    return min(s.start_time_unix_nano for s in spans) / 1e9, max(s.end_time_unix_nano for s in spans) / 1e9


def _exports(path: Path) -> list[tuple[float, ExportTraceServiceRequest]]:
    """Each export in the order it was received (the file's), at the time its latest span ended (its exporter sent
    it no sooner) or, where that is earlier, when the export before it came."""
    out: list[tuple[float, ExportTraceServiceRequest]] = []
    for n, body in enumerate(read_export_bodies(path), 1):
        try:
            export = ExportTraceServiceRequest.FromString(body)
        except Exception as exc:  # (protobuf's DecodeError: the line is no export)
            raise CaptureError(f"{path}:{n}: not a recorded OTLP export ({exc})") from exc
        before = out[-1][0] if out else 0.0
        out.append((max(before, span_bounds(export)[1]), export))
    return out
