"""KV events: blocks stored and lost over time, why they were lost, the most reused prefixes and the most
recomputed blocks."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard import glossary
from dashboard.page_data import KVEventsPage
from dashboard.views import cache
from dashboard.views.charts import show, time_chart
from dashboard.views.tables import show_table

TITLE = "KV events"


def render(ctx) -> None:
    st.header(TITLE)
    data = cache.kv_events(ctx.url, ctx.since, ctx.until, ctx.window_s, ctx.instances)
    if data.lifecycle.empty:
        st.info(glossary.MISSING["kv_events"])
        return
    ctx.runs_note()
    st.subheader("Blocks stored, lost and released")
    st.caption(
        ctx.window_caption() + " Each block once per event (a block several sessions owned counts once). Released: "
        "blocks the agents let go when their session ended, no loss. Prefix hits and allocations cover many blocks "
        "each: each step's story counts them."
    )
    time_chart(
        data.lifecycle,
        ctx.axis,
        y_title="blocks / window",
        mark="area",
        window_s=ctx.window_s,
        empty="No block was stored or lost in this range.",
    )
    churn = data.churn
    st.subheader("Reuse and recomputation")
    st.caption(sample_caption(data, ctx.clock))
    c1, c2, c3 = st.columns(3)
    c1.metric("distinct blocks stored", f"{churn['blocks']:,}", help="Distinct block hashes stored, per instance.")
    c2.metric(
        "blocks stored again after loss",
        f"{churn['restored_blocks']:,}",
        help="Distinct blocks stored again on the same instance after they were lost there (the same block on two "
        "replicas is not a restore).",
    )
    c3.metric(
        "eviction churn",
        "not measured" if churn["churn"] is None else f"{churn['churn']:.1%}",
        help="Stores that brought back a block lost on the same instance / stores. Known as the events were stored: "
        "events stored before revision 0021 do not say.",
    )
    # the reasons' chart and the restored blocks' table each take the page's width: no column of it is cut
    st.subheader("Blocks lost, by reason")
    st.caption(
        "The whole range, each lost block once (evictions, invalidations, vLLM removals; resets not included). "
        + (
            f"Not losses: {data.released:,} blocks the agents released when their session ended."
            if data.released
            else ""
        )
    )
    reasons = data.reasons
    if reasons.empty:
        st.info("No block was lost in this range.")
    else:
        shown = reasons.assign(
            reason=[glossary.series(r) for r in reasons["reason"]],
            kind=[glossary.series(k) for k in reasons["kind"]],
        )
        chart = (
            alt.Chart(shown)
            .mark_bar()
            .encode(
                y=alt.Y("reason:N", title=None, sort="-x", axis=alt.Axis(labelLimit=260)),
                x=alt.X("blocks:Q", title="blocks lost"),
                color=alt.Color("kind:N", title=None, legend=alt.Legend(orient="top")),
                tooltip=["reason", "kind", alt.Tooltip("blocks:Q", format=",")],
            )
        )
        show(chart.properties(height=alt.Step(36)), width="stretch")
    st.subheader("Most recomputed blocks")
    st.caption("Stored again on the same instance after it was lost there, in the stretch counted above.")
    show_table(data.restored.astype({"block_hash": str}), ctx.clock)
    st.subheader("Top prefixes (by sessions building on them)")
    show_table(data.prefixes.astype({"root_hash": str}), ctx.clock)


def sample_caption(data: KVEventsPage, clock) -> str:
    """What the reuse tables and figures below count: every stored block of the range, or its latest ones."""
    sampled, total = data.prefix_rows, data.stored_in_range
    if sampled >= total:
        return f"Over all {total:,} blocks stored in the range."
    return (
        f"Over the latest {sampled:,} of the {total:,} blocks stored in the range (from "
        f"{clock.iso(data.sample_since)}), so this page answers at the same speed over any range: narrow the range "
        "to see an earlier stretch."
    )
