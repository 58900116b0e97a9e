"""Overview: KPIs and the time series of cache pressure, evictions, preemptions, latency and step failures."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import time_chart

TITLE = "Overview"


def _series(frame: pd.DataFrame, columns: list[str], index: str = "window") -> pd.DataFrame:
    present = [c for c in columns if c in frame]
    return frame.set_index(index)[present] if present else pd.DataFrame()


def render(ctx) -> None:
    st.header(TITLE)
    data = cache.overview(ctx.url, ctx.since, ctx.until, ctx.window_s)
    kpis = data["kpis"]
    cols = st.columns(len(kpis))
    for col, (name, value) in zip(cols, kpis.items()):
        if value is None:
            shown = "-"
        elif name == "hit rate":
            shown = f"{value:.1%}"
        elif isinstance(value, float):
            shown = f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        else:
            shown = f"{value:,}"
        col.metric(name, shown)
    st.caption(
        f"{ctx.window_s:g} s windows. blocks lost: each lost block once (evictions, invalidations, vLLM "
        "removals; a block several sessions owned counts once; resets not included), as on the What-if page."
    )
    snaps = data["snapshots"]
    windows = data["windows"]
    left, right = st.columns(2)
    with left:
        st.subheader("KV cache usage and resident blocks")
        none = "No instance snapshots in this range."
        time_chart(st.line_chart, snaps.pivot_table(index="ts", columns="instance", values="kv_usage"), none,
                   y_label="pinned usage")  # fmt: skip
        resident = snaps.pivot_table(index="ts", columns="instance", values="blocks_resident")
        if not resident.empty:
            time_chart(st.line_chart, resident, none, y_label="resident cached blocks")
    with right:
        st.subheader("Hit rate")
        time_chart(st.line_chart, _series(windows, ["hit_rate"]), "No hit-rate data in this range.")
        st.subheader("Blocks lost per second, by reason")
        time_chart(st.area_chart, data["evictions"], "No evictions in this range.")
    left, right = st.columns(2)
    with left:
        st.subheader("TTFT and inter-token latency (s)")
        latency = _series(windows, ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"])
        time_chart(st.line_chart, latency, "No requests in this range.")
        st.subheader("Preemptions")
        time_chart(st.bar_chart, _series(windows, ["preemptions"]), "No preemption counts in this range.")
    with right:
        st.subheader("Agent steps and failures")
        failures = data["failures"]
        time_chart(st.bar_chart, failures, "No agent steps in this range (agents report them through the kvobs SDK).")
        if not failures.empty:
            st.dataframe(cache.failures(ctx.url, ctx.since, ctx.until), hide_index=True)
