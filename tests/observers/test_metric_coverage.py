"""Every metric the engine registers is one it sets, and its counters read 0 from the start, as vLLM's do: a
registered metric nothing sets would export a silent zero that looks like a measurement."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from instrumented_engine.observers.metrics import ENGINE_METRICS, TIER_METRICS, EngineMetrics
from kvobs.semconv.metrics import kvobs_metrics, vllm

ROOT = Path(__file__).resolve().parents[2]
# A spec given to the call that sets it: `_get(vllm.X ...)`, `watch_total(kvobs_metrics.X ...)`, or a table of
# (spec, value) pairs that a loop sets (`for spec, value in ((vllm.X, lat.e2e), ...)`).
_SET = re.compile(
    r"(?:_get|watch_total)\(\s*(vllm|kvobs_metrics)\.(\w+)|\(\s*(vllm|kvobs_metrics)\.(\w+),\s*\w+\.\w+\)"
)


def _names(namespace) -> dict[str, str]:
    return {spec.name: attr for attr, spec in vars(namespace).items()}


def _set_in(folder: str) -> set[str]:
    found = set()
    for path in (ROOT / folder).rglob("*.py"):
        for match in _SET.finditer(path.read_text()):
            found.add(match.group(2) or match.group(4))
    return found


def test_every_metric_the_engine_registers_is_set_by_the_engine():
    attrs = {**_names(vllm), **_names(kvobs_metrics)}
    registered = {attrs[spec.name] for spec in (*ENGINE_METRICS, *TIER_METRICS)}
    assert registered - _set_in("instrumented_engine") == set()


def test_every_kvobs_metric_the_engine_does_not_register_is_the_collectors_or_the_sdks():
    engine = {spec.name for spec in (*ENGINE_METRICS, *TIER_METRICS)}
    others = {attr for attr, spec in vars(kvobs_metrics).items() if spec.name not in engine}
    used = set()
    for folder in ("collectors", "kvobs/agent", "kvobs/telemetry"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"kvobs_metrics\.(\w+)", path.read_text()))
    assert others and others - used == set()


def test_counters_and_histograms_read_zero_before_anything_happens():
    metrics = EngineMetrics("smollm2", cache_config={"block_size": "16"}, max_model_len=512)
    samples = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }
    for spec in ENGINE_METRICS:
        if spec.labels:
            continue
        if spec.type == "counter":
            assert samples[(spec.name + "_total", ())] == 0, spec.name
        elif spec.type == "histogram":
            assert samples[(spec.name + "_count", ())] == 0, spec.name
        elif spec.type == "gauge" and spec is not kvobs_metrics.ENGINE_START_TIME:
            assert (spec.name, ()) not in samples, f"{spec.name} read before the first step sets it"
    assert samples[("vllm:num_preemptions_total", ())] == 0  # vLLM shows it before the first preemption
