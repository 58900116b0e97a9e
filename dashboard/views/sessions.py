"""Sessions: the table (failed first), then one session's footprint, its steps with their causes, and the story of
one step (the same view as the Step timeline page)."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import TimeAxis, time_chart
from dashboard.views.step import render_story, story_url, trace_link
from dashboard.views.tables import show_table

TITLE = "Sessions"
FOOTPRINT = {"session_blocks": "cached blocks", "session_evicted_blocks": "lost",
             "session_evicted_idle_blocks": "lost in tool pauses",
             "session_pending_idle_blocks": "lost while idle, pending"}  # fmt: skip
STEP_COLUMNS = ["step_index", "status", "failure_cause", "slow_cause", "e2e_s", "ttft_s", "typical_s", "evidence",
                "error_type"]  # fmt: skip


def render(ctx) -> None:
    st.header(TITLE)
    table = cache.sessions(ctx.url, ctx.since, ctx.until, ctx.instances)
    if table.empty:
        st.info("No sessions in this range.")
        return
    st.caption(
        "Worst first: most failed steps, then most blocks lost while idle."
        + (f" Footprints on {ctx.scope()}; steps are the fleet's." if ctx.instances is not None else "")
    )
    show_table(table, ctx.clock)
    session_id = st.selectbox("Session", table["session_id"].tolist(), key="session")
    detail = cache.session_detail(ctx.url, session_id)
    st.subheader("KV footprint")
    footprint = detail["footprint"]
    if footprint.empty:
        st.info("No footprint snapshots for this session.")
    else:
        series = footprint.set_index("ts")[list(FOOTPRINT)].rename(columns=FOOTPRINT)
        axis = TimeAxis(ctx.clock, float(series.index.min()), float(series.index.max()))
        time_chart(series, axis, y_title="blocks", empty="No footprint snapshots for this session.")
    st.subheader("Steps and what explains them")
    steps = detail["steps"]
    if steps.empty:
        st.info("No agent steps recorded for this session (agents record them through the kvobs SDK).")
        return
    shown = steps[STEP_COLUMNS].copy()
    shown["story"] = [story_url(session_id, i) for i in steps["step_index"]]
    config = {"story": st.column_config.LinkColumn("story", display_text="open the step's timeline")}
    if ctx.jaeger_url:
        shown["trace"] = [trace_link(ctx.jaeger_url, t) for t in steps["trace_id"]]
        config["trace"] = st.column_config.LinkColumn("trace", display_text="open in Jaeger")
    show_table(shown, ctx.clock, column_config=config)
    st.caption("failure_cause: the error itself, except a timeout, which is given the KV or queue cause found. "
               "slow_cause: what explains a step slower than its session's typical step (typical), none when it "
               "was not slow. 'lost while idle, pending': a tool pause if the session comes back, after its end "
               "if not.")  # fmt: skip
    indexes = cache.session_steps_worst_first(ctx.url, session_id)
    step_index = st.selectbox("Step (failed or slowest first)", indexes, key="session_step")
    render_story(ctx, session_id, int(step_index))
