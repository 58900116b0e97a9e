"""KV events: block lifecycle over time, eviction reasons, the most reused prefixes and the most recomputed blocks."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import time_chart
from dashboard.views.tables import show_table

TITLE = "KV events"


def render(ctx) -> None:
    st.header(TITLE)
    data = cache.kv_events(ctx.url, ctx.since, ctx.until, ctx.window_s, ctx.instances)
    if data["lifecycle"].empty:
        st.info("No KV events in this range.")
        return
    st.subheader("Block lifecycle")
    st.caption(ctx.window_caption())
    time_chart(data["lifecycle"], ctx.axis, y_title="events / window", mark="area", empty="No KV events in this range.")
    churn = data["churn"]
    c1, c2, c3 = st.columns(3)
    c1.metric("distinct blocks stored", f"{churn['blocks']:,}")
    c2.metric(
        "blocks stored again after loss",
        f"{churn['restored_blocks']:,}",
        help="Stored again on the same instance (the same block on two replicas is not a restore).",
    )
    c3.metric("eviction churn", f"{churn['churn']:.1%}")
    left, right = st.columns(2)
    with left:
        st.subheader("Blocks lost, by reason")
        st.caption("Each lost block once (evictions, invalidations, vLLM removals; resets not included).")
        reasons = data["reasons"]
        if reasons.empty:
            st.info("No block was lost in this range.")
        else:
            st.bar_chart(reasons, x="reason", y="blocks", color="kind")
    with right:
        st.subheader("Most recomputed blocks")
        show_table(data["restored"].astype({"block_hash": str}), ctx.clock)
    st.subheader("Top prefixes (by sessions building on them)")
    st.caption(f"From the latest {data['prefix_rows']:,} stored blocks in the range.")
    show_table(data["prefixes"].astype({"root_hash": str}), ctx.clock)
