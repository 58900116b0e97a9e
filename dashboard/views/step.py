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
from kvobs.analytics.steps import JOIN_FIXES, JOIN_WORDS, StepVerdict
from kvobs.semconv.spans import STEP_JOINED

TITLE = "Step timeline"
PHASES = ["step", "tool pause", "tool", "queue", "preemption", "prefill", "decode"]
KV_LANE = "KV: {}"
# the latency's parts, which add up to it (`kvobs.analytics.steps.latency_parts`): column -> words, in the order they
# happen
PARTS = {
    "before_s": "before the server",
    "queue_s": "queue",
    "preempted_s": "preemption",
    "lost_recompute_s": "recomputing the lost prefix",
    "invalidated_recompute_s": "recomputing invalidated blocks",
    "routed_recompute_s": "recomputing a prefix another replica held",
    "new_prefill_s": "prefill of new tokens",
    "decode_s": "decode",
    "tool_s": "its own tool calls",
    "other_s": "outside the engine",
}
# One colour per phase across the page's two charts: a part of the latency and the timeline's phase it is drawn as
# share it (the recomputes are shades of red inside the prefill's blue; a preemption is never drawn as decode).
COLOURS = {
    "step": "#b0bec5",
    "tool pause": "#ffe082",
    "tool": "#ff8f00",
    "its own tool calls": "#ff8f00",
    "queue": "#78909c",
    "preemption": "#8e24aa",
    "recomputing the lost prefix": "#e53935",
    "recomputing invalidated blocks": "#f4511e",
    "recomputing a prefix another replica held": "#ad1457",
    "prefill": "#1e88e5",
    "prefill of new tokens": "#1e88e5",
    "decode": "#43a047",
    "before the server": "#90a4ae",
    "outside the engine": "#6d4c41",
}


KV_MARK = "#263238"  # the KV events' diamonds: no phase's colour


def colour_scale(names: list[str]) -> alt.Scale:
    """The page's one colour for each of `names` (`COLOURS`)."""
    return alt.Scale(domain=names, range=[COLOURS[name] for name in names])


# a typical step's parts: medians of the session's other steps, each part on its own
TYPICAL_PARTS = {
    "typical_before_s": "before the server",
    "typical_queue_s": "queue",
    "typical_prefill_s": "prefill of new tokens",
    "typical_decode_s": "decode",
    "typical_tool_s": "its own tool calls",
    "typical_other_s": "outside the engine",
}


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
        st.info(glossary.MISSING["steps"])
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
    for words in story.misses:
        st.markdown(f"**A miss that is not the cache's:** {words}")
    _breakdown(story.step)
    _timeline(ctx, story)
    st.subheader("What happened, in order")
    events = story.events.rename(columns={"ts": "time"})
    show_text_table(events[["time", "source", "what", "blocks", "tokens", "by_session"]], ctx.clock, ms=True)


def _verdict(ctx, verdict: StepVerdict) -> None:
    step = verdict.record
    status = f"error ({step.error_type})" if step.status == "error" else step.status
    latency = step.latency_s
    typical = step.typical_s
    against = (
        f"against a typical {duration(typical)}"
        if typical is not None and pd.notna(typical)
        else "no typical step: no other successful step of its session (of its kind and size, for a failed one)"
    )
    said = f"{duration(latency)} (the whole step) {against}" if latency is not None and pd.notna(latency) else "unknown"
    failed = glossary.cause(step.failure_cause) or "did not fail"
    slow = glossary.cause(step.slow_cause) if step.slow_cause != "none" else "not slow"
    st.markdown(
        f"**Status:** {status} · **why it failed:** {failed} · **why it was slow:** {slow} · **latency:** {said}"
    )
    st.markdown(f"**Evidence:** {step.evidence or 'nothing in the KV record explains this step.'}")
    if verdict.decided:
        st.caption("Decided by the collector once the session had settled: the verdict the Overview counts.")
    else:
        st.caption("Worked out as this page opened: no collector has decided this step's verdict.")
    join = verdict.facts.request_join
    if isinstance(join, str) and join in STEP_JOINED:
        st.caption(f"Its server request: {JOIN_WORDS[join]}.")
    link = trace_link(ctx.jaeger_url, step.trace_id)
    if link:
        st.markdown(f"[Open its trace in Jaeger]({link})")
    elif not ctx.jaeger_url:
        st.caption("Start the dashboard with --jaeger-url to link each step to its trace.")


def _breakdown(step: StepVerdict) -> None:
    """This step's latency by part (they add up to it), next to each part's typical value."""

    def known(value) -> float:
        return float(value) if value is not None and pd.notna(value) else 0.0

    typical = "typical step"  # (each part's median over its session's other steps: the caption says so)
    rows = [
        {"which": which, "part": part, "seconds": known(step.value(column)), "order": i}
        for which, parts in (("this step", PARTS), (typical, TYPICAL_PARTS))
        for column, part in parts.items()
        for i in [list(PARTS.values()).index(part)]
        if known(step.value(column)) > 0
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
                scale=colour_scale(list(PARTS.values())),
                title=None,
                legend=alt.Legend(orient="bottom", columns=3, labelLimit=300),
            ),
            order="order:Q",
            tooltip=["which", "part", alt.Tooltip("seconds:Q", format=".3f")],
        )
    )
    show(chart.properties(height=alt.Step(34)), width="stretch")
    rate = step.facts.prefill_rate
    st.caption(
        "Typical step: each part's median over its session's other steps. Each instant of the step is counted "
        "once: the queue, preemption, prefill and decode from its request rows "
        "and the engine's preemption and re-admission events, its tool calls as the agent recorded them, the time "
        "before its first request reached the server (that request's arrival stamp), and the rest outside the "
        "engine. The recompute inside the prefill is the share its tokens are of the tokens the "
        "prefill computed"
        + (f" ({rate:,.0f} tokens/s, this prefill's own pace)." if rate is not None and pd.notna(rate) else ".")
        + " The typical parts are medians each on its own, so they need not add up to the typical latency."
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
            color=alt.Color("phase:N", scale=colour_scale(PHASES), title="phase"),
            tooltip=["lane", "what"],
        )
    )
    layers = [spans]
    if not points.empty:
        layers.append(
            alt.Chart(points)
            .mark_point(filled=True, shape="diamond", color=KV_MARK)
            .encode(
                x=time_x("at_ms", clock, since - pad, until + pad),
                y=y,
                size=alt.Size(
                    "blocks:Q",
                    title="blocks",
                    scale=alt.Scale(range=[40, 400]),
                    legend=alt.Legend(format=",d", tickMinStep=1),
                ),
                tooltip=[alt.Tooltip("when:N", title="time"), "what"],
            )
        )
    st.subheader("Timeline")
    show(alt.layer(*layers).properties(height=34 * len(lanes) + 60), width="stretch")
    if story.pause is None:
        st.caption("No tool pause before it: the session's first step.")
    if story.requests.empty:
        st.info(_no_request(story.step))


def _no_request(step: StepVerdict) -> str:
    """What the page says of a step whose server request the store does not hold: never a guess at one."""
    answered, join = step.facts.response_id, step.facts.request_join
    if step.record.failure_cause == "never_reached_server":  # the evidence says how the store knows
        return "No server request found for this step: it never reached the server, as the evidence above shows."
    if isinstance(join, str) and join in JOIN_WORDS:  # judged by the collector as the step's spans arrived
        why = JOIN_WORDS[join] + (f"; to join it, {JOIN_FIXES[join]}" if join in JOIN_FIXES else "")
    elif isinstance(answered, str) and answered:
        why = (
            f"the server answered `{answered}`, and no request with that id reached the store (is the collector "
            "receiving that server's spans?)"
        )
    elif step.record.status == "error":
        why = "the call failed without an answer, so it names no request, and no trace context reached a server"
    else:
        why = "no trace context reached a server the store hears from, and the step names no response id"
    return f"No server request found for this step: {why}. Its KV record and latency split are unknown."
