"""`kvobs collect --join-wait-s`: how long a framework's call waits for its server's request span, and a request
for its step before its blocks are tied by inference (the removals of blocks naming no session wait that long and
a little more)."""

from __future__ import annotations

import argparse

import pytest

from collectors.block_owners import HOLD_AFTER_JOIN_S
from collectors.collector import Collector, CollectorOptions
from collectors.command import add_parser
from collectors.traces.span_steps import JOIN_WAIT_S


def parsed(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["collect", "--otlp-http", "127.0.0.1:0", *flags])


def test_the_join_wait_reaches_the_step_maker_and_ownership_by_inference(store):
    assert parsed().join_wait_s is None  # (the collector's own default then: JOIN_WAIT_S)
    assert parsed("--join-wait-s", "45").join_wait_s == 45.0
    options = CollectorOptions(kv_events=["vllm=tcp://127.0.0.1:1"], otlp_http="127.0.0.1:0", join_wait_s=45.0)
    collector = Collector(options, store=store)
    assert collector.span_steps.join_wait_s == 45.0 == collector.block_owners.join_wait_s
    assert collector.streams[0].ingest.hold_s == 45.0 + HOLD_AFTER_JOIN_S
    default = Collector(CollectorOptions(kv_events=["vllm=tcp://127.0.0.1:1"], otlp_http="127.0.0.1:0"), store=store)
    assert default.span_steps.join_wait_s == JOIN_WAIT_S and default.streams[0].ingest.hold_s > JOIN_WAIT_S


def test_without_agent_spans_nothing_is_held():
    """KV events alone (no OTLP receiver): no step can name a session, so no removal waits for one."""
    collector = Collector(CollectorOptions(kv_events=["vllm=tcp://127.0.0.1:1"], store_url="sqlite://"))
    assert collector.block_owners is None and collector.streams[0].ingest.hold_s == 0


def test_a_negative_join_wait_is_refused():
    with pytest.raises(ValueError, match="--join-wait-s must not be negative"):
        CollectorOptions(otlp_http="127.0.0.1:0", join_wait_s=-1.0)
