"""The recorded vLLM 0.32 run (tests/fixtures/vllm-0.32-cpu, made by its record.py), read as the tests need it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"


@dataclass(frozen=True)
class Frame:
    recv_ts: float
    frames: tuple[bytes, ...]


@cache
def scrapes() -> list[tuple[float, str]]:
    """(scrape time, body) in order."""
    index = json.loads((FIXTURES / "metrics" / "index.json").read_text())
    return [(e["ts"], (FIXTURES / "metrics" / e["file"]).read_text()) for e in index]


@cache
def kv_messages() -> list[Frame]:
    out = []
    for line in (FIXTURES / "kv_events.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.append(Frame(d["recv_ts"], tuple(base64.b64decode(f) for f in d["frames_b64"])))
    return out


@cache
def otlp_bodies() -> list[bytes]:
    lines = (FIXTURES / "otlp_traces.jsonl").read_text().splitlines()
    return [base64.b64decode(json.loads(line)["body_b64"]) for line in lines]


@cache
def agent_steps() -> list[dict]:
    return json.loads((FIXTURES / "agent_steps.json").read_text())
