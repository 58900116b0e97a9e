"""Alerts: what fires now, the history of transitions, and the rules."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.tables import show_table

TITLE = "Alerts"
SHOWN = ["ts", "rule", "severity", "state", "instance", "session_id", "value", "summary"]


def nothing_firing(data) -> str:
    """Why nothing fires, in one line: never a plain "all is well" while steps fail or a rule is on its way."""
    failed, steps = data.failed_steps
    said = "Nothing is firing."
    if not data.holding.empty:
        rule = data.holding.sort_values("for_s").iloc[0]
        held = f"has held {rule['held_s']:.0f} s" if rule["held_s"] > 0 else "holds in its latest window only"
        said += (
            f" {len(data.holding)} rule(s) hold now but not yet for their `for`: {rule['rule']} {held}, and fires "
            f"once it has held {rule['for_s']:.0f} s (below)."
        )
    if failed:
        said += f" {failed:,} of the {steps:,} agent steps in this range failed."
        if data.holding.empty:
            said += (
                " A rule fires only when its condition has held through its `for` (minutes: the table of rules "
                "below), and a run shorter than that fires nothing."
            )
    return said


def render(ctx) -> None:
    st.header(TITLE)
    data = cache.alerts(ctx.url, ctx.since, ctx.until, ctx.instances)
    if ctx.instances is not None:
        st.caption(f"Alerts of {ctx.scope()}, and those of no instance (a session's, the fleet's).")
    st.subheader("Firing")
    if data.active.empty:
        st.info(nothing_firing(data))
    else:
        show_table(data.active[SHOWN], ctx.clock)
    if not data.holding.empty:
        st.subheader("Holding, not yet for long enough")
        st.caption(
            "Each rule's condition holds at the end of the range; a rule fires once it has held for its `for` "
            "(`kvobs alerts --watch 15` evaluates them, and a collector or `kvobs demo` at each round's end)."
        )
        show_table(data.holding, ctx.clock)
    st.subheader("History")
    if data.history.empty:
        st.info("No alert transitions in this range. `kvobs alerts --store URL --watch 15` evaluates the rules.")
    else:
        show_table(data.history[SHOWN], ctx.clock)
    with st.expander("Rules"):
        from kvobs.alerts.rules import builtin_rules

        rules = pd.DataFrame(
            [
                {
                    "rule": r.name,
                    "severity": r.severity,
                    "condition": f"{r.signal} {r.op} {r.threshold:g}",
                    "holds for (s)": r.for_s,
                    "window (s)": r.window_s,
                }
                for r in builtin_rules()
            ]
        )
        show_table(rules, ctx.clock)
