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

from kvobs.alerts.rules import Rule
from kvobs.alerts.signals import SIGNALS
from kvobs.store.interface import Store
from kvobs.store.rows import AlertRecord
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)

Key = tuple[str | None, str | None]


class Evaluator:
    """Args:
    store: where signals are read and transitions written (through a `StoreWriter`, flushed before sinks hear).
    rules: the rules to evaluate.
    sinks: told of every transition after it is stored.
    """

    def __init__(self, store: Store, rules: Iterable[Rule], *, sinks: Iterable = ()) -> None:
        self.store = store
        self.rules = list(rules)
        self.sinks = list(sinks)

    def firing(self, rule: Rule, now: float) -> dict[Key, float]:
        """Keys for which `rule` holds now (and through its `for`), with the value now."""
        return {key: value for key, (value, held_s) in self.holding(rule, now).items() if held_s >= _span(rule)}

    def holding(self, rule: Rule, now: float) -> dict[Key, tuple[float, float]]:
        """Keys for which `rule`'s condition holds at `now`, each with its value now and how long it has held, in
        whole windows back from `now` up to its `for`: it fires once that reaches its `for` (the Alerts page's
        "holds now, not yet for long enough")."""
        signal = SIGNALS[rule.signal]
        held: dict[Key, tuple[float, float]] = {}
        for k in range(math.ceil(rule.for_s / rule.window_s) + 1):
            point = now - k * rule.window_s
            values = signal.fn(self.store, point - rule.window_s, point, **rule.params)
            holding = {(inst, sess): value for inst, sess, value in values if rule.holds(value)}
            if k == 0:
                held = {key: (value, 0.0) for key, value in holding.items()}
            alive = [key for key, (_, held_s) in held.items() if key in holding and held_s == (k - 1) * rule.window_s]
            if k and not alive:
                break
            for key in alive:
                held[key] = (held[key][0], k * rule.window_s)
        return held

    def active(self) -> dict[tuple[str, str | None, str | None], AlertRecord]:
        """The latest row of every (rule, instance, session) whose latest state is firing."""
        rows = self.store.lookups.latest_alert_states().astype(object)
        rows = rows.where(rows.notna(), None)
        records = (AlertRecord(**row) for row in rows.drop(columns="id").to_dict("records"))
        return {(r.rule, r.instance, r.session_id): r for r in records if r.state == "firing"}

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
            for (instance, session_id), value in sorted(firing.items(), key=lambda item: _ordered(*item[0])):
                if (rule.name, instance, session_id) not in active:
                    transitions.append(self._row(rule, "firing", now, instance, session_id, value))
            for (name, instance, session_id), row in sorted(active.items(), key=lambda item: _ordered(*item[0][1:])):
                if name == rule.name and (instance, session_id) not in firing:
                    transitions.append(
                        self._row(rule, "resolved", now, instance, session_id, None, summary=f"resolved: {row.summary}")
                    )
        if transitions:
            self._store(transitions)
            for sink in self.sinks:
                try:
                    sink.send(transitions)
                except Exception:
                    log.exception("alert sink %s failed", type(sink).__name__)
        return transitions

    def _store(self, transitions: list[dict]) -> None:
        """Commit the transitions before anyone is told of them."""
        writer = StoreWriter(self.store)
        try:
            writer.add_many([AlertRecord(**row) for row in transitions])
        finally:
            writer.close()
        if writer.num_dropped:
            raise RuntimeError(f"the store refused {writer.num_dropped} alert transitions")

    @staticmethod
    def _row(rule: Rule, state: str, now: float, instance, session_id, value, summary: str | None = None) -> dict:
        return {
            "ts": now,
            "rule": rule.name,
            "severity": rule.severity,
            "state": state,
            "instance": instance,
            "session_id": session_id,
            "value": value,
            "summary": (summary or rule.describe(value, instance, session_id))[:1024],
        }


def _span(rule: Rule) -> float:
    """How long back a rule's condition must hold to fire: its `for`, in whole windows."""
    return math.ceil(rule.for_s / rule.window_s) * rule.window_s


def _ordered(instance: str | None, session_id: str | None) -> tuple[str, str]:
    """Transitions in one order on every backend (by instance, then session), whatever order the reads return."""
    return instance or "", session_id or ""
