"""Overview: KPIs and the time series of cache pressure, evictions, preemptions, latency and step failures."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views import cache

TITLE = "Overview"


def _series(frame: pd.DataFrame, columns: list[str], index: str = "window") -> pd.DataFrame:
    present = [c for c in columns if c in frame]
    out = frame.set_index(index)[present] if present else pd.DataFrame()
    out.index = pd.to_datetime(out.index, unit="s")
    return out


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
    st.caption(f"{ctx.window_s:g} s windows")
    snaps = data["snapshots"]
    left, right = st.columns(2)
    with left:
        st.subheader("KV cache usage and resident blocks")
        if snaps.empty:
            st.info("No instance snapshots in this range.")
        else:
            usage = snaps.pivot_table(index="ts", columns="instance", values="kv_usage")
            usage.index = pd.to_datetime(usage.index, unit="s")
            st.line_chart(usage, y_label="pinned usage")
            resident = snaps.pivot_table(index="ts", columns="instance", values="blocks_resident")
            if not resident.empty:
                resident.index = pd.to_datetime(resident.index, unit="s")
                st.line_chart(resident, y_label="resident cached blocks")
    with right:
        st.subheader("Hit rate")
        hit = _series(data["windows"], ["hit_rate"])
        st.line_chart(hit) if not hit.empty else st.info("No hit-rate data in this range.")
        st.subheader("Blocks lost per second, by reason")
        evictions = data["evictions"].copy()
        if evictions.empty:
            st.info("No evictions in this range.")
        else:
            evictions.index = pd.to_datetime(evictions.index, unit="s")
            st.area_chart(evictions)
    left, right = st.columns(2)
    with left:
        st.subheader("TTFT and inter-token latency (s)")
        latency = _series(data["windows"], ["ttft_p50", "ttft_p99", "itl_p50", "itl_p99"])
        st.line_chart(latency) if not latency.empty else st.info("No requests in this range.")
        st.subheader("Preemptions")
        preempt = _series(data["windows"], ["preemptions"])
        st.bar_chart(preempt) if not preempt.empty else st.info("No preemption counts in this range.")
    with right:
        st.subheader("Agent steps and failures")
        failures = data["failures"].copy()
        if failures.empty:
            st.info("No agent steps in this range (agents report them through the kvobs SDK).")
        else:
            failures.index = pd.to_datetime(failures.index, unit="s")
            st.bar_chart(failures)
            st.dataframe(cache.failures(ctx.url, ctx.since, ctx.until), hide_index=True)
