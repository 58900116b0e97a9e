"""Sessions: the table (what the cache cost them first), then one session's footprint, its steps with what explains
them, and the story of one step (the same view as the Step timeline page)."""

from __future__ import annotations

import streamlit as st

from dashboard import data, glossary
from dashboard.verdicts import story_url
from dashboard.views import cache
from dashboard.views.charts import TimeAxis, time_chart
from dashboard.views.step import render_story, trace_link
from dashboard.views.tables import show_table, show_text_table
from kvobs.analytics.cache import ties_said

TITLE = "Sessions"
FOOTPRINT = {
    "session_blocks": "cached blocks",
    "session_evicted_blocks": "lost",
    "session_evicted_idle_blocks": "lost in tool pauses",
    "session_pending_idle_blocks": "lost while idle, pending",
}
STEP_COLUMNS = [
    "step_index",
    "instance",
    "status",
    "failure_cause",
    "slow_cause",
    "latency_s",
    "typical_s",
    "evidence",
    "verdict",
]
TABLE_COLUMNS = [
    "session_id",
    "agent_name",
    "source",
    "started_by",
    "subagents",
    "started_at",
    "ended_at",
    "steps",
    "join_rate",
    "failed",
    "lost_idle",
    "pending_idle",
    "lost",
    "blocks",
    "hit_rate",
    "e2e_p50",
]


def replica_hops(steps) -> str:
    """ "replica-a -> replica-b (step 1) -> replica-a (step 2)": where the session's steps ran, each change of
    replica with the step that made it; "" for a session that stayed on one replica."""
    ran = [(int(i), name) for i, name in zip(steps["step_index"], steps["instance"]) if isinstance(name, str)]
    if len({name for _, name in ran}) < 2:
        return ""
    parts = [ran[0][1]]
    for (_, before), (index, name) in zip(ran, ran[1:]):
        if name != before:
            parts.append(f"{name} (step {index})")
    return " -> ".join(parts)


def subagents_said(table, session_id: str) -> str:
    """Who started the session and whom it started (subagents are sessions of their own: their steps and KV blocks
    are theirs), from the requests' own headers; "" where neither is known."""
    row = table[table["session_id"] == session_id]
    parent = row["started_by"].iloc[0] if len(row) and "started_by" in row else None
    children = table.loc[table["started_by"] == session_id, "session_id"].tolist() if "started_by" in table else []
    said = [f"Started by session {parent}." if isinstance(parent, str) else ""]
    if children:
        listed = ", ".join(children[:10]) + (f" and {len(children) - 10:,} more" if len(children) > 10 else "")
        said.append(f"Its subagents ({len(children):,}, sessions of their own): {listed}.")
    return " ".join(s for s in said if s)


def render(ctx) -> None:
    st.header(TITLE)
    table = cache.sessions(ctx.url, ctx.since, ctx.until, ctx.instances)
    if table.empty:
        st.info(glossary.MISSING["sessions"])
        return
    ctx.runs_note()
    st.caption(
        "By what the cache cost them: most blocks lost in tool pauses first, then most lost at all, then most failed "
        "steps. Hit rate: cached prompt tokens / prompt tokens of the session's steps. Joined: of its steps made of "
        "an agent framework's spans, the share tied to their server request (blank where none is: the SDK's steps "
        "carry their trace to the server); a step not tied says why on its page."
        + (f" Footprints on {ctx.scope()}; steps are the fleet's." if ctx.instances is not None else "")
    )
    shown = table.head(data.SESSION_ROWS)
    if len(shown) < len(table):
        st.caption(
            f"The {len(shown):,} sessions the cache cost most, of the {len(table):,} in this range: a narrower range "
            "or fewer instances lists the others (the Step timeline page opens any session by `?session=`)."
        )
    show_table(shown[[c for c in TABLE_COLUMNS if c in shown]], ctx.clock)
    session_id = st.selectbox("Session", shown["session_id"].tolist(), key="session")
    detail = cache.session_detail(ctx.url, session_id)
    family = subagents_said(table, session_id)
    if family:
        st.caption(family)
    st.subheader("KV footprint")
    footprint = detail.footprint
    if footprint.empty:
        st.info("No footprint snapshots for this session.")
    else:
        series = footprint.set_index("ts")[list(FOOTPRINT)].rename(columns=FOOTPRINT)
        axis = TimeAxis(ctx.clock, float(series.index.min()), float(series.index.max()))
        time_chart(series, axis, y_title="blocks", mark="step", empty="No footprint snapshots for this session.")
        st.caption(
            "Each line holds its value until the next snapshot. Lost while idle, pending: a tool pause if the "
            "session comes back, after its end if not."
        )
    ties = cache.session_ties(ctx.url, session_id)
    if ties:
        st.caption(ties_said(ties))
    st.subheader("Steps and what explains them")
    steps = detail.steps
    if steps.empty:
        st.info("No agent steps recorded for this session (agents record them through the kvobs SDK).")
        return
    shown = steps[STEP_COLUMNS].copy()
    shown["story"] = [f"[open]({story_url(session_id, i)})" for i in steps["step_index"]]
    if ctx.jaeger_url:
        shown["trace"] = [
            f"[Jaeger]({link})" if (link := trace_link(ctx.jaeger_url, t)) else "" for t in steps["trace_id"]
        ]
    show_text_table(shown, ctx.clock)
    hops = replica_hops(steps)
    if hops:
        st.caption(f"Replicas, step by step: {hops}. A step sent elsewhere than where its prefix was cached says so.")
    st.caption(
        "Why it failed: the error itself, except a timeout, which is given the part of its latency that cost it "
        "(the queue, a lost prefix, a preemption, its prefill or decode, its own tools, outside the engine). Why it "
        "was slow: the part of its whole latency that explains most of its excess over the session's typical "
        "step; blank when it was not slow. Verdict: decided by the collector once the session settled (what the "
        "Overview counts), or worked out as this page opened."
    )
    st.subheader("Its hit rate, and what it missed")
    st.caption(
        "In whole prompt blocks of its requests whose hash chain is known: the hit rate it achieved (and of its "
        "hits, those loaded from a lower tier), what a cache "
        "that never evicted would have given it (available), and each missed block once, by why (routing, cold, "
        "invalidated, tool pause, capacity, unexplained; they add up to its prompt's whole blocks). It replays the "
        "KV events of the session's span, so it runs when asked."
    )
    if st.button("Split this session's hit rate", key="session_split") or st.session_state.get("split_asked"):
        st.session_state["split_asked"] = True
        split = cache.session_shortfall(ctx.url, session_id)
        if split.empty:
            st.info("None of its requests has a known hash chain (it needs the replicas' KV events).")
        else:
            show_table(split.drop(columns=["session_id"]), ctx.clock)
            tax = cache.session_tax(ctx.url, session_id, split)
            show_table(tax.drop(columns=["session_id"]), ctx.clock)
            st.caption(
                "Its recompute tax: of the prompt tokens it prefilled, those computed before and computed again, by "
                "why; preemption blank where its engine does not say what a preemption recomputed."
            )
    indexes = cache.session_steps_by_cache_cost(ctx.url, session_id)
    step_index = st.selectbox("Step (what the cache cost it first)", indexes, key="session_step")
    render_story(ctx, session_id, int(step_index))
