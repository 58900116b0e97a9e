"""Built-in rules whose condition holds now but not yet for their `for`: why nothing fires, said rather than hidden."""

from __future__ import annotations

import pandas as pd

from kvobs.alerts.evaluator import Evaluator
from kvobs.alerts.rules import builtin_rules
from kvobs.store.interface import Store

HOLDING = ["rule", "severity", "instance", "session_id", "value", "held_s", "for_s", "summary"]


def holding_rules(store: Store, now: float, firing: set[tuple], instances=None) -> pd.DataFrame:
    """The built-in rules whose condition holds at `now` for a key not in `firing` ((rule, instance, session_id)
    triples), each with how long it has held and the `for` it needs; with `instances`, those instances' keys only."""
    evaluator, rows = Evaluator(store, []), []
    for rule in builtin_rules():
        for (instance, session_id), (value, held_s) in evaluator.holding(rule, now).items():
            if (rule.name, instance, session_id) in firing or (instances is not None and instance not in instances):
                continue
            summary = rule.describe(value, instance, session_id)
            rows.append((rule.name, rule.severity, instance, session_id, value, held_s, rule.for_s, summary))
    return pd.DataFrame(rows, columns=HOLDING)
