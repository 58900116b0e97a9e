"""deploy/prometheus: the alert rules pass `promtool check rules` and their unit tests, and every metric they read
is one a real vLLM (the recorded 0.32 scrape) or our own processes (`kvobs serve`, `kvobs collect`) expose."""

from __future__ import annotations

import re
import subprocess

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.collectors.recorded import scrapes
from tests.deploy.tools import REPO, needs

RULES = REPO / "deploy/prometheus/rules/kvobs.rules.yml"
RULE_TESTS = REPO / "deploy/prometheus/tests/kvobs.rules.test.yml"
PROMETHEUS_CONFIG = REPO / "deploy/prometheus/prometheus.yml"
METRIC = re.compile(r"\b((?:vllm:|kvobs_)[a-z_:]+?)(?:_bucket|_count|_sum)?\b(?=[\[{(\s)]|$)")
OLD_VLLM_NAMES = {"vllm:gpu_cache_usage_perc"}  # vLLM < 0.12; the rule reads it beside the new name


def _rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def _alerts() -> set[str]:
    return {rule["alert"] for rule in _rules() if "alert" in rule}


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


@needs("promtool", "prometheus")
def test_promtool_checks_the_rules_and_the_prometheus_config():
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0 and "SUCCESS: 18 rules found" in done.stdout, done.stdout + done.stderr
    done = _promtool("check", "config", "--syntax-only", str(PROMETHEUS_CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr


@needs("promtool", "prometheus")
def test_promtool_unit_tests_pass_and_cover_every_alert():
    done = _promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    tested = {
        t["alertname"]
        for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
        if t["exp_alerts"]
    }
    assert tested == _alerts()


def test_every_rule_has_a_severity_summary_description_and_runbook():
    for rule in _rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
            assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]


def _rule_metrics() -> set[str]:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    names = {m for rule in _rules() for m in METRIC.findall(rule["expr"])} - recorded
    return {name.removesuffix("_total") for name in names}  # as the parser names counter families


def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_the_rules_read_what_vllm_and_kvobs_expose(smollm2_source, store):
    from collectors.collector import Collector, CollectorOptions
    from collectors.own_metrics import CollectorMetrics
    from tests.server.conftest import running_server

    wanted = _rule_metrics()
    assert {"vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds", "kvobs_agent_steps"} <= wanted
    vllm = _families(scrapes()[-1][1])
    with running_server(smollm2_source, num_blocks=64) as server:
        engine = _families(httpx.get(server.url + "/metrics").text)
    collector = Collector(CollectorOptions(otlp_http="127.0.0.1:0"), store=store)
    collector.start()
    try:
        own = {family.name for family in CollectorMetrics(collector).collect()}
    finally:
        collector.stop()
    vllm_names = {m for m in wanted if m.startswith("vllm:")}
    assert vllm_names - OLD_VLLM_NAMES <= vllm, vllm_names - vllm
    assert vllm_names - OLD_VLLM_NAMES <= engine, vllm_names - engine  # the same rules watch our engine
    kvobs_names = {m for m in wanted if m.startswith("kvobs_")}
    assert kvobs_names <= engine | own, kvobs_names - engine - own
    assert "kvobs_session_prefix_lost" in engine & own  # from our engine, and from the collector for a vLLM


@needs("amtool", "prometheus-alertmanager")
def test_amtool_checks_the_alertmanager_config_and_its_inhibitions_name_real_alerts():
    config = REPO / "deploy/alertmanager/alertmanager.yml"
    done = subprocess.run(["amtool", "check-config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    named = set(re.findall(r'alertname="(\w+)"', config.read_text()))
    assert named and named <= _alerts()
