"""Sessions: the table, then one session's footprint timeline with its steps, failures and their attribution."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import time_chart

TITLE = "Sessions"


def trace_link(jaeger_url: str | None, trace_id) -> str | None:
    if not jaeger_url or not isinstance(trace_id, str) or not trace_id.strip("0"):
        return None
    return f"{jaeger_url.rstrip('/')}/trace/{trace_id}"


def render(ctx) -> None:
    st.header(TITLE)
    table = cache.sessions(ctx.url, ctx.since, ctx.until)
    if table.empty:
        st.info("No sessions in this range.")
        return
    st.dataframe(table, hide_index=True)
    session_id = st.selectbox("Session", table["session_id"].tolist(), key="session")
    detail = cache.session_detail(ctx.url, session_id)
    st.subheader("KV footprint")
    names = {"session_blocks": "cached blocks", "session_evicted_blocks": "lost",
             "session_evicted_idle_blocks": "lost in tool pauses",
             "session_pending_idle_blocks": "lost while idle, pending"}  # fmt: skip
    footprint = detail["footprint"].set_index("ts")[list(names)].rename(columns=names)
    time_chart(st.line_chart, footprint, "No footprint snapshots for this session.")
    st.subheader("Steps and what explains them")
    steps = detail["steps"]
    if steps.empty:
        st.info("No agent steps recorded for this session (agents record them through the kvobs SDK).")
        return
    columns = ["step_index", "status", "failure_cause", "slow_cause", "e2e_s", "ttft_s", "typical_s", "evidence",
               "trace_id"]  # fmt: skip
    shown = steps[columns].copy()
    shown["trace"] = [trace_link(ctx.jaeger_url, t) for t in shown.pop("trace_id")]
    st.dataframe(shown, hide_index=True, column_config={
        "trace": st.column_config.LinkColumn("trace", display_text="open in Jaeger"),
    })  # fmt: skip
    st.caption("failure_cause: the error itself, except a timeout, which is given the KV or queue cause found. "
               "slow_cause: what explains a step slower than its session's typical step (typical_s), none when it "
               "was not slow. 'lost while idle, pending': a tool pause if the session comes back, after its end "
               "if not.")  # fmt: skip
    if not ctx.jaeger_url:
        st.caption("Start the dashboard with --jaeger-url to link each step to its trace.")
