"""The recorded vLLM 0.32 run (tests/fixtures/vllm-0.32-cpu, made by its record.py), read as the tests need it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from collectors.capture import KV_EVENTS, METRICS, OTLP, read_export_bodies, read_kv_messages, read_scrapes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32-cpu"


@dataclass(frozen=True)
class Frame:
    recv_ts: float
    frames: tuple[bytes, ...]


@cache
def scrapes() -> list[tuple[float, str]]:
    """(scrape time, body) in order."""
    return read_scrapes(FIXTURES / METRICS)


@cache
def kv_messages() -> list[Frame]:
    return [Frame(ts, tuple(frames)) for ts, frames in read_kv_messages(FIXTURES / KV_EVENTS)]


@cache
def otlp_bodies() -> list[bytes]:
    return read_export_bodies(FIXTURES / OTLP)


@cache
def agent_steps() -> list[dict]:
    return json.loads((FIXTURES / "agent_steps.json").read_text())
