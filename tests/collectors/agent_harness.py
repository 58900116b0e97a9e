"""A real `kvobs serve` and a real `kvobs collect` for agents traced by their own instrumentation packages.

    with served_and_collected(smollm2_source, store) as h:
        answered = h.agent("openinference", conversations=["a", "b"])   # an agent process (agent_scenarios.py)
    h.bodies                                  # every OTLP export the collector received, in order (for fixtures)

With `KVOBS_RECORD_AGENT_FIXTURES=1` in the environment, a run given `record=NAME` writes what it received to
`tests/fixtures/agents/NAME/otlp_traces.jsonl` (the format of `tests/recording.py`: one base64 protobuf body a line;
this machine's install paths in span attributes and stack traces rewritten to /opt/venv and /opt/kvobs) and the
steps the collector made of it, once the live test's checks against the agent's own record passed, to
`steps.json`; and the engine's KV-event messages as a second subscriber heard them, to `kv_events.jsonl` (the
format of `tests/recording.py`).

Each agent runs in a process of its own, as a user's agent does (an instrumentation patches the OpenAI client for
its whole process, and not every one undoes that: OpenLLMetry's keeps injecting `traceparent`), and exports
OTLP/HTTP to the collector, flushing before it exits; the engine exports its `llm_request` spans over gRPC and
publishes its KV events on ZMQ; the collector scrapes its /metrics. On leaving, the engine is shut down (flushing
its spans and KV events), every request span the agents' answers name is awaited, and the collector stops
(deciding the steps still waiting for their parents).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collectors.collector import Collector, CollectorOptions
from kvobs.analytics.steps.attribution import attribute_steps
from tests.recording import subscribe
from tests.server.conftest import free_port, running_server
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "agents"
# agents whose packages cannot share the test environment run from their own (scripts/install.sh makes them)
AGENT_VENVS = {"llamaindex": ROOT / ".venv-llamaindex"}
STEP_COLUMNS = [
    "session_id",
    "step_index",
    "status",
    "error_type",
    "response_id",
    "request_id",
    "request_join",
    "trace_id",
    "span_id",
    "tools",
]


@dataclass
class Harness:
    server: object
    collector: Collector
    otlp_http: str  # the collector's OTLP/HTTP traces endpoint
    service: str
    bodies: list[bytes] = field(default_factory=list)
    kv_frames: list[dict] = field(default_factory=list)  # the engine's KV-event messages, when recording
    served: int = 0  # requests the engine answered (the agents' answers count them): all their spans are awaited

    def agent(self, scenario: str, **params) -> dict:
        """Run `tests/collectors/agent_scenarios.py` SCENARIO in a process of its own against this server and
        collector; returns what it printed (JSON: the response ids it got under `answered`, and its own facts)."""
        config = {"base_url": self.server.url + "/v1", "otlp": self.otlp_http, "service": self.service, **params}
        python = sys.executable
        if scenario in AGENT_VENVS:
            python = str(AGENT_VENVS[scenario] / "bin" / "python")
            assert Path(python).exists(), f"{scenario}'s environment is missing: run scripts/install.sh"
        done = subprocess.run(
            [python, "-m", "tests.collectors.agent_scenarios", scenario, json.dumps(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        self.served += sum(len(ids) for ids in result["answered"].values())
        return result


@contextmanager
def served_and_collected(
    source,
    store,
    *,
    num_blocks: int = 48,
    max_model_len: int = 512,
    service: str = "travel-agent",
    record: str | None = None,
) -> Iterator[Harness]:
    kv, replay, grpc, http = free_port(), free_port(), free_port(), free_port()
    options = {
        "kv_events_endpoint": f"tcp://*:{kv}",
        "kv_events_replay_endpoint": f"tcp://*:{replay}",
        "otlp_endpoint": f"http://127.0.0.1:{grpc}",
    }
    with running_server(source, options=options, num_blocks=num_blocks, max_model_len=max_model_len) as server:
        collector = Collector(
            CollectorOptions(
                vllm_urls=[f"engine={server.url}"],
                kv_events=[f"tcp://127.0.0.1:{kv}"],
                kv_events_replay=[f"tcp://127.0.0.1:{replay}"],
                otlp_grpc=f"127.0.0.1:{grpc}",
                otlp_http=f"127.0.0.1:{http}",
                interval_s=0.5,
                settle_s=1.0,
            ),
            store=store,
        )
        harness = Harness(server, collector, f"http://127.0.0.1:{http}/v1/traces", service)
        receive = collector.receiver.handle

        def recording(request):
            refused = receive(request)  # raises Busy when not taken: then it is not recorded either
            harness.bodies.append(request.SerializeToString())
            return refused

        collector.receiver.handle = recording
        recording_kv = record is not None and os.environ.get("KVOBS_RECORD_AGENT_FIXTURES") == "1"
        stop = threading.Event()
        if recording_kv:  # a second subscriber of the engine's stream, as `tests/recording.py` records
            tap = threading.Thread(target=subscribe, args=(f"tcp://127.0.0.1:{kv}", harness.kv_frames, stop))
            tap.start()
        collector.start()
        try:
            wait_for(lambda: collector.scraper.num_scrapes >= 1)
            yield harness
            server.shutdown()  # flushes its request spans
            wait_for(lambda: collector.span_ingest.num_requests >= harness.served, timeout_s=30)
        finally:
            collector.stop()
            stop.set()
    if recording_kv:
        record_fixture(FIXTURES / record, harness.bodies, store, harness.kv_frames)


def record_fixture(folder: Path, bodies: list[bytes], store, kv_frames: list[dict] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if kv_frames:  # the format of `tests/recording.py`: one ZMQ message a line, its receive time and frames in base64
        (folder / "kv_events.jsonl").write_text("".join(json.dumps(m) + "\n" for m in kv_frames))
    with open(folder / "otlp_traces.jsonl", "w") as out:
        for body in bodies:
            line = {
                "path": "/v1/traces",
                "content_type": "application/x-protobuf",
                "body_b64": base64.b64encode(_without_paths(body)).decode(),
            }
            out.write(json.dumps(line) + "\n")
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    verdicts = attribute_steps(steps, store.reads.requests(), store.reads.kv_events())
    joined = verdicts.set_index(["session_id", "step_index"])["num_requests"]
    steps = steps[STEP_COLUMNS].assign(joined=[int(joined[k]) for k in zip(steps["session_id"], steps["step_index"])])
    sessions = store.reads.sessions().sort_values("session_id")
    sessions = sessions[sessions["session_id"].isin(steps["session_id"])][  # (not another tenant's, from KV events)
        ["session_id", "source", "agent_name", "num_steps", "num_failed_steps"]
    ]
    truth = {
        "steps": json.loads(steps.to_json(orient="records")),
        "sessions": json.loads(sessions.to_json(orient="records")),
    }
    (folder / "steps.json").write_text(json.dumps(truth, indent=1) + "\n")


def _without_paths(body: bytes) -> bytes:
    """The export with this machine's install paths (vLLM's `code.filepath`, stack traces) rewritten."""
    request = ExportTraceServiceRequest.FromString(body)
    here = {sys.prefix: "/opt/venv", str(ROOT): "/opt/kvobs"}
    if os.environ.get("KVOBS_VLLM_VENV"):
        here[os.environ["KVOBS_VLLM_VENV"].rstrip("/")] = "/opt/venv"
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                values = [kv.value for kv in span.attributes]
                values += [kv.value for event in span.events for kv in event.attributes]
                for value in values:
                    if value.WhichOneof("value") == "string_value":
                        for path, replacement in here.items():
                            value.string_value = value.string_value.replace(path, replacement)
    return request.SerializeToString()
