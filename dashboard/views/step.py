"""Step timeline: one agent step's story on one screen (`?session=ID&step=N` opens it; alerts and Jaeger link here).

The verdict (failure cause, slow cause, the evidence), where its latency went next to the session's typical step,
a timeline of the step, the tool pause before it and each request's queue, prefill and decode, with the KV events
of the session on it (sized by the blocks each covers); then everything in time order.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import data, glossary
from dashboard.clock import duration
from dashboard.views import cache
from dashboard.views.charts import show, time_x
from dashboard.views.tables import show_text_table

TITLE = "Step timeline"
PHASES = ["step", "tool pause", "tool", "queue", "prefill", "decode"]
KV_LANE = "KV: {}"
# the latency's parts, in the order they happen; the prefill split into what the KV record explains and the rest
PARTS = [
    "queue",
    "recomputing the lost prefix",
    "recomputing invalidated blocks",
    "preemption",
    "rest of the prefill",
    "decode",
    "outside the engine",
]


def trace_link(jaeger_url: str | None, trace_id) -> str | None:
    if not jaeger_url or not isinstance(trace_id, str) or not trace_id.strip("0"):
        return None
    return f"{jaeger_url.rstrip('/')}/trace/{trace_id}"


def render(ctx) -> None:
    st.header(TITLE)
    ranked = cache.sessions_with_steps(ctx.url, ctx.since, ctx.until, ctx.instances)
    requested_session = st.query_params.get("session")
    ranked_ids = ranked["session_id"].head(data.SESSION_ROWS).tolist()  # bounded: those the cache cost most
    sessions = list(dict.fromkeys(([requested_session] if requested_session else []) + ranked_ids))
    if not sessions:
        st.info("No agent steps in this range (agents report them through the kvobs SDK).")
        return
    c1, c2 = st.columns(2)
    session_id = c1.selectbox("Session (what the cache cost it first)", sessions, key="story_session")
    indexes = cache.session_steps_by_cache_cost(ctx.url, session_id)
    requested_step = st.query_params.get("step")
    if session_id == requested_session and requested_step is not None and requested_step.isdigit():
        indexes = list(dict.fromkeys([int(requested_step), *indexes]))
    if not indexes:
        st.info(f"Session {session_id} has no agent steps in the store.")
        return
    step_index = c2.selectbox("Step (what the cache cost it first)", indexes, key="story_step")
    st.query_params.update({"session": session_id, "step": str(step_index)})  # this step, as a link to share
    render_story(ctx, session_id, int(step_index))


def render_story(ctx, session_id: str, step_index: int) -> None:
    story = cache.step_story(ctx.url, session_id, step_index)
    if story is None:
        st.warning(f"The store has no step {step_index} of session {session_id}.")
        return
    _verdict(ctx, story.step)
    _breakdown(story.step)
    _timeline(ctx, story)
    st.subheader("What happened, in order")
    events = story.events.rename(columns={"ts": "time"})
    show_text_table(events[["time", "source", "what", "blocks", "tokens", "by_session"]], ctx.clock, ms=True)


def _verdict(ctx, step: dict) -> None:
    status = f"error ({step['error_type']})" if step["status"] == "error" else step["status"]
    latency = step["latency_s"]
    measured = "TTFT" if pd.notna(step.get("ttft_s")) else "end to end"
    said = (
        f"{duration(latency)} ({measured}) against a typical {duration(step['typical_s'])}"
        if pd.notna(latency)
        else "unknown"
    )
    failed = glossary.cause(step["failure_cause"]) or "did not fail"
    slow = glossary.cause(step["slow_cause"]) if step["slow_cause"] != "none" else "not slow"
    st.markdown(
        f"**Status:** {status} · **why it failed:** {failed} · **why it was slow:** {slow} · **latency:** {said}"
    )
    st.markdown(f"**Evidence:** {step['evidence'] or 'nothing in the KV record explains this step.'}")
    link = trace_link(ctx.jaeger_url, step.get("trace_id"))
    if link:
        st.markdown(f"[Open its trace in Jaeger]({link})")
    elif not ctx.jaeger_url:
        st.caption("Start the dashboard with --jaeger-url to link each step to its trace.")


def _breakdown(step: dict) -> None:
    """This step's latency by part, next to the session's typical step."""

    def known(value) -> float:
        return float(value) if value is not None and pd.notna(value) else 0.0

    estimates = [known(step[k]) for k in ("lost_recompute_s", "invalidated_recompute_s", "preempted_s")]
    prefill = known(step["prefill_s"])
    scale = min(1.0, prefill / sum(estimates)) if sum(estimates) > 0 else 0.0  # the estimates fit inside it
    mine = [
        known(step["queue_s"]),
        *(e * scale for e in estimates),
        prefill - sum(estimates) * scale,
        known(step["decode_s"]),
        known(step["other_s"]),
    ]
    usual = [
        known(step["typical_queue_s"]),
        0.0,
        0.0,
        0.0,
        known(step["typical_prefill_s"]),
        known(step["typical_decode_s"]),
        known(step["typical_other_s"]),
    ]
    rows = [
        {"which": which, "part": part, "seconds": max(value, 0.0), "order": i}
        for which, values in (("this step", mine), ("typical step (median of its session's others)", usual))
        for i, (part, value) in enumerate(zip(PARTS, values))
        if value > 0
    ]
    if not rows:
        return
    st.subheader("Where its latency went")
    chart = (
        alt.Chart(pd.DataFrame(rows))
        .mark_bar(height=22)
        .encode(
            x=alt.X("seconds:Q", title="seconds", stack="zero"),
            y=alt.Y("which:N", title=None, sort=None),
            color=alt.Color(
                "part:N",
                scale=alt.Scale(domain=PARTS),
                title=None,
                legend=alt.Legend(orient="bottom", columns=4, labelLimit=300),
            ),
            order="order:Q",
            tooltip=["which", "part", alt.Tooltip("seconds:Q", format=".3f")],
        )
    )
    show(chart.properties(height=alt.Step(34)), width="stretch")
    rate = step.get("prefill_rate")
    st.caption(
        "The engine's queue, prefill and decode come from its request rows; the prefill's KV parts are "
        + (
            f"estimated at {rate:,.0f} tokens/s, the instance's measured prefill cost per token; "
            if rate is not None and pd.notna(rate)
            else "unknown without a measured prefill rate; "
        )
        + "outside the engine is the rest of the latency (client, network, tokenizing)."
    )


def _timeline(ctx, story) -> None:
    clock = ctx.clock
    since, until = story.span
    bars = story.timeline.assign(
        start_ms=clock.wall_ms(story.timeline["start"]), end_ms=clock.wall_ms(story.timeline["end"])
    )
    kv = story.events[story.events["source"] == "kv"]
    points = kv.assign(
        lane=[KV_LANE.format(glossary.series(k)) for k in kv["kind"]],
        at_ms=clock.wall_ms(kv["ts"]),
        when=[clock.iso(t, ms=True) for t in kv["ts"]],
    )
    lanes = list(dict.fromkeys(bars["lane"].tolist() + points["lane"].tolist()))
    pad = max((until - since) * 0.02, 0.05)
    x = time_x("start_ms", clock, since - pad, until + pad, ms=until - since < 60)
    y = alt.Y("lane:N", sort=lanes, title=None, axis=alt.Axis(labelLimit=260))
    spans = (
        alt.Chart(bars)
        .mark_bar(height=14)
        .encode(
            x=x,
            x2="end_ms:Q",
            y=y,
            color=alt.Color("phase:N", scale=alt.Scale(domain=PHASES), title="phase"),
            tooltip=["lane", "what"],
        )
    )
    layers = [spans]
    if not points.empty:
        layers.append(
            alt.Chart(points)
            .mark_point(filled=True, shape="diamond")
            .encode(
                x=time_x("at_ms", clock, since - pad, until + pad),
                y=y,
                size=alt.Size("blocks:Q", title="blocks", scale=alt.Scale(range=[40, 400])),
                tooltip=[alt.Tooltip("when:N", title="time"), "what"],
            )
        )
    st.subheader("Timeline")
    show(alt.layer(*layers).properties(height=34 * len(lanes) + 60), width="stretch")
    if story.pause is None:
        st.caption("No tool pause before it: the session's first step.")
    if story.requests.empty:
        st.info(_no_request(story.step))


def _no_request(step: dict) -> str:
    """What the page says of a step whose server request the store does not hold: never a guess at one."""
    answered = step.get("response_id")
    if isinstance(answered, str) and answered:
        why = (
            f"the server answered `{answered}`, and no request with that id reached the store (is the collector "
            "receiving that server's spans?)"
        )
    elif step.get("status") == "error":
        why = "the call failed without an answer, so it names no request, and no trace context reached a server"
    else:
        why = "no trace context reached a server the store hears from, and the step names no response id"
    return f"No server request found for this step: {why}. Its KV record and latency split are unknown."
