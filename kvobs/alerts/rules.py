"""Alert rules: YAML, validated at load with the rule's name and the field at fault.

rules:
  - name: KVCacheUsageHigh         # unique
    signal: kv_usage                # one of kvobs.alerts.signals.SIGNALS
    op: ">="                        # > >= < <= == !=
    threshold: 0.9
    for: 60s                        # optional: the condition must hold this long (number of s, or 30s/5m/1h)
    window: 30s                     # optional: the signal's lookback (default 60s)
    severity: warning               # info | warning | critical
    params: {}                      # optional: the signal's parameters
    summary: "KV cache {value:.0%} pinned on {instance}"   # optional; {value} {instance} {session_id} {rule}
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from kvobs.alerts.signals import SIGNALS

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne}
SEVERITIES = ("info", "warning", "critical")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_FIELDS = {"name", "signal", "op", "threshold", "for", "window", "severity", "params", "summary"}


class RuleError(ValueError):
    """A rule file that cannot be used; the message names the rule and the field."""


@dataclass(frozen=True)
class Rule:
    name: str
    signal: str
    op: str
    threshold: float
    severity: str
    for_s: float = 0.0
    window_s: float = 60.0
    params: dict = field(default_factory=dict)
    summary: str = "{rule}: {value}"

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def describe(self, value: float, instance: str | None, session_id: str | None) -> str:
        try:
            return self.summary.format(
                value=value, instance=instance or "all instances", session_id=session_id or "-", rule=self.name
            )
        except (KeyError, IndexError, ValueError):
            return f"{self.name}: {value}"


def parse_duration(value, where: str) -> float:
    if isinstance(value, bool):
        raise RuleError(f"{where}: not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if match is None:
            raise RuleError(f"{where}: not a duration: {value!r} (examples: 30, 30s, 5m, 1h)")
        seconds = float(match.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[match.group(2)]
    if seconds < 0:
        raise RuleError(f"{where}: a duration cannot be negative: {value!r}")
    return seconds


def parse_rule(raw, index: int) -> Rule:
    if not isinstance(raw, dict):
        raise RuleError(f"rule #{index + 1}: expected a mapping with name, signal, op, threshold, severity")
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        raise RuleError(f"rule #{index + 1}: field 'name' is required (a non-empty string)")
    where = f"rule {name!r}"
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise RuleError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(_FIELDS))})")
    for required in ("signal", "op", "threshold", "severity"):
        if required not in raw:
            raise RuleError(f"{where}: field {required!r} is required")
    if raw["signal"] not in SIGNALS:
        raise RuleError(
            f"{where}: field 'signal': unknown signal {raw['signal']!r}; choose one of {', '.join(sorted(SIGNALS))}"
        )
    if raw["op"] not in OPS:
        raise RuleError(f"{where}: field 'op': {raw['op']!r} is not one of {' '.join(OPS)}")
    threshold = raw["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise RuleError(f"{where}: field 'threshold': expected a number, got {threshold!r}")
    if raw["severity"] not in SEVERITIES:
        raise RuleError(f"{where}: field 'severity': {raw['severity']!r} is not one of {', '.join(SEVERITIES)}")
    params = raw.get("params") or {}
    if not isinstance(params, dict):
        raise RuleError(f"{where}: field 'params': expected a mapping, got {params!r}")
    unknown_params = sorted(set(params) - set(SIGNALS[raw["signal"]].params))
    if unknown_params:
        raise RuleError(
            f"{where}: field 'params': signal {raw['signal']!r} takes no parameter "
            f"{unknown_params[0]!r} (it takes: {', '.join(SIGNALS[raw['signal']].params) or 'none'})"
        )
    window = parse_duration(raw.get("window", 60), f"{where}: field 'window'")
    if window <= 0:
        raise RuleError(f"{where}: field 'window': must be positive")
    summary = raw.get("summary", "{rule}: {value}")
    if not isinstance(summary, str):
        raise RuleError(f"{where}: field 'summary': expected a string")
    return Rule(
        name=name,
        signal=raw["signal"],
        op=raw["op"],
        threshold=float(threshold),
        severity=raw["severity"],
        for_s=parse_duration(raw.get("for", 0), f"{where}: field 'for'"),
        window_s=window,
        params=dict(params),
        summary=summary,
    )


def parse_rules(text: str, source: str = "rules") -> list[Rule]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("rules"), list):
        raise RuleError(f"{source}: expected a mapping with a 'rules' list")
    rules = [parse_rule(raw, i) for i, raw in enumerate(document["rules"])]
    seen = set()
    for rule in rules:
        if rule.name in seen:
            raise RuleError(f"{source}: rule {rule.name!r} is defined twice")
        seen.add(rule.name)
    return rules


def builtin_rules() -> list[Rule]:
    text = resources.files("kvobs.alerts").joinpath("builtin_rules.yaml").read_text()
    return parse_rules(text, "built-in rules")


def load_rules(path: str | Path | None = None, *, include_builtin: bool = True) -> list[Rule]:
    """The built-in rules, with those of `path` added (a rule of the same name replaces the built-in one)."""
    rules = {r.name: r for r in builtin_rules()} if include_builtin else {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise RuleError(f"cannot read rule file {path}: {exc.strerror}") from exc
        rules.update({r.name: r for r in parse_rules(text, str(path))})
    return list(rules.values())
