"""Evaluate alert rules over the store; write transitions (firing, resolved) to `alerts` and send them to sinks.

    evaluator = Evaluator(store, load_rules(), sinks=[LogSink()])
    evaluator.evaluate(now=time.time())     # one round; `kvobs alerts --watch 15` repeats it

A rule fires for a key (instance, session or the whole fleet) when its condition holds at `now` and, with `for`,
at every point one window apart back to `now - for`: evaluation needs no memory between runs, so a one-shot
`kvobs alerts` and a watching one agree. Deduplication is the store's: a key whose latest row is `firing` is not
written again until it resolves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from sqlalchemy import func, select

from kvobs.alerts.rules import Rule
from kvobs.alerts.signals import SIGNALS
from kvobs.store.db import Store
from kvobs.store.schema import AlertRow

log = logging.getLogger(__name__)

Key = tuple[str | None, str | None]


class Evaluator:
    def __init__(self, store: Store, rules: Iterable[Rule], *, sinks: Iterable = ()) -> None:
        self.store = store
        self.rules = list(rules)
        self.sinks = list(sinks)

    def firing(self, rule: Rule, now: float) -> dict[Key, float]:
        """Keys for which `rule` holds now (and through its `for`), with the value now."""
        signal = SIGNALS[rule.signal]
        points = [now - k * rule.window_s for k in range(math.ceil(rule.for_s / rule.window_s) + 1)]
        held: dict[Key, float] | None = None
        for point in points:
            values = signal.fn(self.store, point - rule.window_s, point, **rule.params)
            holding = {(inst, sess): value for inst, sess, value in values if rule.holds(value)}
            held = holding if held is None else {key: value for key, value in held.items() if key in holding}
            if not held:
                return {}
        return held or {}

    def active(self) -> dict[tuple[str, str | None, str | None], AlertRow]:
        """The latest row of every (rule, instance, session) whose latest state is firing."""
        latest = (select(func.max(AlertRow.id).label("id"))
                  .group_by(AlertRow.rule, AlertRow.instance, AlertRow.session_id).subquery())  # fmt: skip
        with self.store.session() as s:
            rows = s.scalars(select(AlertRow).join(latest, AlertRow.id == latest.c.id)).all()
        return {(r.rule, r.instance, r.session_id): r for r in rows if r.state == "firing"}

    def evaluate(self, now: float) -> list[dict]:
        """One round at `now`: the transitions written and sent (new firing, resolved)."""
        active = self.active()
        transitions = []
        for rule in self.rules:
            try:
                firing = self.firing(rule, now)
            except Exception:
                log.exception("evaluating rule %s failed; the other rules go on", rule.name)
                continue
            for (instance, session_id), value in firing.items():
                if (rule.name, instance, session_id) not in active:
                    transitions.append(self._row(rule, "firing", now, instance, session_id, value))
            for (name, instance, session_id), row in active.items():
                if name == rule.name and (instance, session_id) not in firing:
                    transitions.append(self._row(rule, "resolved", now, instance, session_id, None,
                                                 summary=f"resolved: {row.summary}"))  # fmt: skip
        if transitions:
            with self.store.session() as s, s.begin():  # committed before anyone is told
                s.add_all(AlertRow(**row) for row in transitions)
            for sink in self.sinks:
                try:
                    sink.send(transitions)
                except Exception:
                    log.exception("alert sink %s failed", type(sink).__name__)
        return transitions

    @staticmethod
    def _row(rule: Rule, state: str, now: float, instance, session_id, value, summary: str | None = None) -> dict:
        return {"ts": now, "rule": rule.name, "severity": rule.severity, "state": state, "instance": instance,
                "session_id": session_id, "value": value,
                "summary": (summary or rule.describe(value, instance, session_id))[:1024]}  # fmt: skip
