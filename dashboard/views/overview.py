"""Overview: KPIs and the time series of cache pressure, evictions, preemptions, latency and step failures; on a
fleet, one row per instance and one measure as small multiples."""

from __future__ import annotations

import streamlit as st

from dashboard.data import FLEET_SERIES
from dashboard.views import cache
from dashboard.views.charts import small_multiples, time_chart
from dashboard.views.tables import show_table

TITLE = "Overview"
KPI_HELP = {
    "requests": "LLM requests that arrived in the range.",
    "agent steps": "Agent steps (recorded by the kvobs SDK) that started in the range: the fleet's, whatever "
    "instances are chosen.",
    "failed steps": "Agent steps that ended in an error (any error type).",
    "hit rate": "Prefix-cache hit rate: mean of the instances' snapshots in the range.",
    "blocks lost": "Cached blocks evicted, invalidated or removed (each lost block once; resets not included).",
    "preemptions": "Increase of the instances' preemption counters over the range.",
    "TTFT p99 (s)": "99th percentile time to first token of the requests in the range, in seconds.",
}


def _shown(name: str, value) -> str:
    if value is None:
        return "-"
    if name == "hit rate":
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,}"


def render(ctx) -> None:
    st.header(TITLE)
    per_instance = len(ctx.shown_instances) > 1
    data = cache.overview(ctx.url, ctx.since, ctx.until, ctx.window_s, ctx.instances, per_instance)
    kpis = data["kpis"]
    for col, (name, value) in zip(st.columns(len(kpis)), kpis.items()):
        col.metric(name, _shown(name, value), help=KPI_HELP[name])
    st.caption(ctx.window_caption() + " Blocks lost: each lost block once (evictions, invalidations, vLLM removals; "
               "a block several sessions owned counts once; resets not included), as on the What-if page.")  # fmt: skip
    axis = ctx.axis
    no_snaps = "No instance snapshots in this range."
    left, right = st.columns(2)
    with left:
        st.subheader("KV cache usage")
        time_chart(data["usage"], axis, y_title="pinned KV usage", y_format="%", empty=no_snaps)
        st.subheader("Resident cached blocks")
        no_resident = ("The instances report no resident cached blocks (vLLM's /metrics has no such gauge; its KV "
                       "events do, on the KV events page)." if data["num_snapshots"] else no_snaps)  # fmt: skip
        time_chart(data["resident"], axis, y_title="blocks", empty=no_resident)
    with right:
        st.subheader("Hit rate")
        no_hits = "No hit-rate samples in this range (an instance reports one once it has been queried)."
        time_chart(data["hit_rate"], axis, y_title="hit rate", y_format="%", empty=no_hits)
        st.subheader("Blocks lost per second, by reason")
        unknown = ("No KV events recorded in this range, so losses are unknown here (vLLM publishes them with "
                   "--kv-events-config; see the README).")  # fmt: skip
        time_chart(data["evictions"], axis, y_title="blocks / s", mark="area", zero_is_empty=True,
                   empty="No block was lost in this range." if data["watching_kv"] else unknown)  # fmt: skip
    left, right = st.columns(2)
    with left:
        st.subheader("TTFT and inter-token latency")
        time_chart(data["latency"], axis, y_title="seconds", empty="No requests in this range.")
        st.subheader("Preemptions")
        time_chart(data["preemptions"], axis, y_title="preemptions / window", mark="bar", window_s=ctx.window_s,
                   zero_is_empty=True, empty=f"No preemptions in this range ({data['num_snapshots']:,} instance "
                   "snapshots)." if data["num_snapshots"] else no_snaps)  # fmt: skip
    with right:
        st.subheader("Agent steps and failures")
        no_steps = "No agent steps in this range (agents report them through the kvobs SDK)."
        drawn = time_chart(
            data["steps"], axis, y_title="steps / window", mark="bar", window_s=ctx.window_s, empty=no_steps
        )
        if drawn and kpis["failed steps"]:
            st.caption("Failed steps by cause (with the evidence for each cause):")
            show_table(cache.failures(ctx.url, ctx.since, ctx.until), ctx.clock)
    if per_instance:
        render_fleet(ctx, data["fleet"])


def render_fleet(ctx, data: dict) -> None:
    """Per instance: a row each (most blocks lost first), then one measure as small multiples."""
    st.subheader("Per instance")
    st.caption(f"{ctx.scope().capitalize()}, most blocks lost first. Requests come from each instance's traces "
               "(`service.instance.id`), snapshots from its /metrics, losses from its KV-event stream; a dash: that "
               "source reported nothing for the instance in this range.")  # fmt: skip
    show_table(data["table"], ctx.clock)
    measure = st.selectbox("Measure, per instance", list(FLEET_SERIES), key="fleet_measure",
                           format_func=lambda c: FLEET_SERIES[c][0])  # fmt: skip
    title, unit, fmt = FLEET_SERIES[measure]
    frame = data["series"][measure]
    silent = [name for name in data["table"]["instance"] if name not in frame.columns]
    small_multiples(frame, ctx.axis, y_title=unit, y_format=fmt,
                    empty=f"No instance reported {title.lower()} in this range.")  # fmt: skip
    if silent and not frame.empty:
        st.caption(f"No {title.lower()} from: {', '.join(silent)} (their source did not report it; unknown, not 0).")
