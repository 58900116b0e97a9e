"""One rule set: `kvobs alerts` (over the store) and the Prometheus rule file name the same alerts with the same
severity, `for`, comparison and threshold, rule by rule. Only InferenceTargetDown is Prometheus' alone: it watches
Prometheus' own scrapes of the engine, vLLM and the collector, which the store never sees."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from kvobs.alerts.rules import builtin_rules, parse_duration

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_RULES = ROOT / "deploy" / "prometheus" / "rules" / "kvobs.rules.yml"
PROMETHEUS_ONLY = {"InferenceTargetDown"}


def _prometheus_alerts() -> dict[str, dict]:
    groups = yaml.safe_load(PROMETHEUS_RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _comparisons(expr: str) -> set[tuple[str, float]]:
    """Every `op number` in a PromQL expression (`> 14.4 * 0.01` counts as `> 14.4`: a burn rate of the budget)."""
    found = re.findall(r"(>=|<=|==|!=|>|<)\s*([0-9]+(?:\.[0-9]+)?)", expr)
    return {(op, float(number)) for op, number in found}


def test_every_store_rule_is_the_prometheus_alert_of_the_same_name():
    prometheus = _prometheus_alerts()
    store = {rule.name: rule for rule in builtin_rules()}
    assert set(prometheus) - set(store) == PROMETHEUS_ONLY
    assert set(store) <= set(prometheus)
    for name, rule in store.items():
        alert = prometheus[name]
        assert alert["labels"]["severity"] == rule.severity, name
        assert parse_duration(alert.get("for", "0s"), name) == rule.for_s, name
        assert (rule.op, float(rule.threshold)) in _comparisons(alert["expr"]), name
        for key, value in rule.params.items():  # numeric parameters are the expression's other bounds
            if key in ("baseline_min", "min_steps", "min_requests"):
                assert (">=", float(value)) in _comparisons(alert["expr"]), (name, key)
            if key == "exclude_errors":
                assert all(f'error_type!="{error}"' in alert["expr"] for error in value), name
            if key == "slo_s":
                assert f'le="{value}"' in PROMETHEUS_RULES.read_text(), name


def test_the_check_catches_a_changed_threshold():
    alert = _prometheus_alerts()["KVCacheUsageHigh"]
    assert (">=", 0.9) in _comparisons(alert["expr"]) and (">=", 0.95) not in _comparisons(alert["expr"])
    assert _comparisons("kvobs:ttft_slo_bad_ratio:rate1h > 14.4 * 0.01") == {(">", 14.4)}


def test_list_rules_prints_each_rule_once():
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "alerts", "--list-rules"], capture_output=True, text=True, check=True
    )
    names = [rule.name for rule in builtin_rules()]
    for name in names:
        assert done.stdout.count(name) == 1, name
