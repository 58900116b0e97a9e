"""Which ingest core attributes a collector's KV events is never silent: its first log line with KV streams says it,
its /metrics has `kvobs_collector_kv_core_compiled`, and `kvobs doctor --collector` names the pure-Python fallback
as a problem, with the command that builds the compiled core."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from collectors.collector import Collector, CollectorOptions
from kvobs.commands.doctor import exposition_checks
from tests.server.conftest import free_port


@pytest.mark.parametrize("choice", ["compiled", "python"])
def test_the_collectors_core_is_said_at_start_on_metrics_and_by_doctor(choice, tmp_path, monkeypatch, caplog, request):
    request.getfixturevalue("compiled_kv_core")  # (built, so that the compiled choice is the compiled core)
    monkeypatch.setenv("KVOBS_KV_CORE", choice)
    options = CollectorOptions(
        store_url=f"sqlite:///{tmp_path / 'kvobs.db'}",
        kv_events=[f"vllm-a=tcp://127.0.0.1:{free_port()}"],
        kv_events_bind=True,
        interval_s=3600,
    )
    collector = Collector(options)
    with caplog.at_level(logging.INFO, logger="collectors.kv.core"):
        collector.start()
    try:
        exposed = generate_latest(collector.registry).decode()
    finally:
        collector.stop()
    compiled = choice == "compiled"
    assert f"kvobs_collector_kv_core_compiled {float(compiled)}" in exposed
    ok, words = {n: (ok, w) for n, ok, w in exposition_checks(exposed)}["(KV ingest core)"]
    said = [r.getMessage() for r in caplog.records if r.name == "collectors.kv.core"]
    if compiled:
        assert ok and words == "compiled (C++)"
        assert said == [said[0]] and said[0].startswith("KV ingest core: compiled (C++, ")
    else:
        assert not ok and "python -m collectors.kv.core.build" in words
        assert said == [
            "KV ingest core: pure Python, as KVOBS_KV_CORE=python: the compiled core is the faster "
            "(bench/results/collector_ingest.md)"
        ]


def test_a_collector_without_kv_streams_says_no_core(tmp_path):
    options = CollectorOptions(
        store_url=f"sqlite:///{tmp_path / 'kvobs.db'}", dynamo_trace=str(tmp_path), interval_s=3600
    )
    collector = Collector(options)
    exposed = generate_latest(collector.registry).decode()
    assert "kvobs_collector_kv_core_compiled" not in exposed
    assert "(KV ingest core)" not in {n for n, _, _ in exposition_checks(exposed)}
