"""Alerts: what fires now, the history of transitions, and the rules."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.tables import show_table

TITLE = "Alerts"
SHOWN = ["ts", "rule", "severity", "state", "instance", "session_id", "value", "summary"]


def render(ctx) -> None:
    st.header(TITLE)
    data = cache.alerts(ctx.url, ctx.since, ctx.until, ctx.instances)
    if ctx.instances is not None:
        st.caption(f"Alerts of {ctx.scope()}, and those of no instance (a session's, the fleet's).")
    st.subheader("Firing")
    if data.active.empty:
        st.success("Nothing is firing.")
    else:
        show_table(data.active[SHOWN], ctx.clock)
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
