"""Step timeline: one agent step's story on one screen (`?session=ID&step=N` opens it; alerts and Jaeger link here).

The verdict (failure cause, slow cause, the evidence), a timeline of the step, the tool pause before it and each
request's queue, prefill and decode, with the KV events of the session on it; then everything in time order.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.clock import duration
from dashboard.views import cache
from dashboard.views.charts import time_x
from dashboard.views.tables import show_table

TITLE = "Step timeline"
PHASES = ["step", "tool pause", "queue", "prefill", "decode"]
KV_LANE = "KV: {}"


def trace_link(jaeger_url: str | None, trace_id) -> str | None:
    if not jaeger_url or not isinstance(trace_id, str) or not trace_id.strip("0"):
        return None
    return f"{jaeger_url.rstrip('/')}/trace/{trace_id}"


def story_url(session_id: str, step_index: int) -> str:
    from urllib.parse import urlencode

    return "?" + urlencode({"page": "step", "session": session_id, "step": int(step_index)})


def render(ctx) -> None:
    st.header(TITLE)
    steps = cache.steps_worst_first(ctx.url, ctx.since, ctx.until)
    requested_session = st.query_params.get("session")
    sessions = list(dict.fromkeys(([requested_session] if requested_session else []) + steps["session_id"].tolist()))
    if not sessions:
        st.info("No agent steps in this range (agents report them through the kvobs SDK).")
        return
    c1, c2 = st.columns(2)
    session_id = c1.selectbox("Session (failed first)", sessions, key="story_session")
    indexes = cache.session_steps_worst_first(ctx.url, session_id)
    requested_step = st.query_params.get("step")
    if session_id == requested_session and requested_step is not None and requested_step.isdigit():
        indexes = list(dict.fromkeys([int(requested_step), *indexes]))
    if not indexes:
        st.info(f"Session {session_id} has no agent steps in the store.")
        return
    step_index = c2.selectbox("Step (failed or slowest first)", indexes, key="story_step")
    st.query_params.update({"page": "step", "session": session_id, "step": str(step_index)})
    render_story(ctx, session_id, int(step_index))


def render_story(ctx, session_id: str, step_index: int) -> None:
    story = cache.step_story(ctx.url, session_id, step_index)
    if story is None:
        st.warning(f"The store has no step {step_index} of session {session_id}.")
        return
    _verdict(ctx, story.step)
    _timeline(ctx, story)
    st.subheader("What happened, in order")
    events = story.events.rename(columns={"ts": "time"})
    show_table(events[["time", "source", "what", "blocks", "tokens", "by_session"]], ctx.clock, ms=True)


def _verdict(ctx, step: dict) -> None:
    status = f"error ({step['error_type']})" if step["status"] == "error" else step["status"]
    latency = f"{duration(_latency(step))} against a typical {duration(step['typical_s'])}" \
        if _latency(step) is not None else "unknown"  # fmt: skip
    st.markdown(f"**Status:** {status} · **failure cause:** {step['failure_cause'] or '-'} · **slow cause:** "
                f"{step['slow_cause']} · **latency** (TTFT, else end to end): {latency}")  # fmt: skip
    st.markdown(f"**Evidence:** {step['evidence'] or 'nothing in the KV record explains this step.'}")
    link = trace_link(ctx.jaeger_url, step.get("trace_id"))
    if link:
        st.markdown(f"[Open its trace in Jaeger]({link})")
    elif not ctx.jaeger_url:
        st.caption("Start the dashboard with --jaeger-url to link each step to its trace.")


def _latency(step: dict) -> float | None:
    for key in ("ttft_s", "e2e_s"):
        if step.get(key) is not None and pd.notna(step[key]):
            return float(step[key])
    return None


def _timeline(ctx, story) -> None:
    clock = ctx.clock
    since, until = story.span
    bars = story.timeline.assign(start_ms=clock.wall_ms(story.timeline["start"]),
                                 end_ms=clock.wall_ms(story.timeline["end"]))  # fmt: skip
    kv = story.events[story.events["source"] == "kv"]
    points = kv.assign(lane=[KV_LANE.format(k) for k in kv["kind"]], at_ms=clock.wall_ms(kv["ts"]),
                       when=[clock.iso(t, ms=True) for t in kv["ts"]])  # fmt: skip
    lanes = list(dict.fromkeys(bars["lane"].tolist() + points["lane"].tolist()))
    pad = max((until - since) * 0.02, 0.05)
    x = time_x("start_ms", clock, since - pad, until + pad, ms=until - since < 60)
    y = alt.Y("lane:N", sort=lanes, title=None)
    spans = alt.Chart(bars).mark_bar(height=14).encode(
        x=x, x2="end_ms:Q", y=y, color=alt.Color("phase:N", scale=alt.Scale(domain=PHASES), title="phase"),
        tooltip=["lane", "what"])  # fmt: skip
    layers = [spans]
    if not points.empty:
        layers.append(alt.Chart(points).mark_point(filled=True, shape="diamond").encode(
            x=time_x("at_ms", clock, since - pad, until + pad), y=y,
            size=alt.Size("blocks:Q", title="blocks", scale=alt.Scale(range=[40, 400])),
            tooltip=[alt.Tooltip("when:N", title="time"), "what"]))  # fmt: skip
    st.subheader("Timeline")
    st.altair_chart(alt.layer(*layers).properties(height=34 * len(lanes) + 60), width="stretch")
    if story.pause is None:
        st.caption("No tool pause before it: the session's first step.")
    if story.requests.empty:
        st.caption("None of this step's requests reached a server the store hears from (none is recorded).")
