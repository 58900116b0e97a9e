"""Pressure vs latency: a scatter of one pressure measure against one latency, and their lagged correlation."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.tables import show_table

TITLE = "Pressure vs latency"
PRESSURE = {
    "usage_mean": "KV usage (mean)",
    "usage_max": "KV usage (max)",
    "resident_blocks": "resident blocks",
    "evictions_per_s": "blocks lost / s",
    "preemptions": "preemptions",
    "waiting": "waiting requests",
}
LATENCY = {"ttft_p99": "TTFT p99", "ttft_p50": "TTFT p50", "itl_p99": "ITL p99", "itl_p50": "ITL p50",
           "queue_p99": "queue p99"}  # fmt: skip
WINDOWS = (5, 10, 30, 60, 300, 900)


def render(ctx) -> None:
    st.header(TITLE)
    c1, c2, c3 = st.columns(3)
    # never a window shorter than the instances' reporting interval (mostly empty windows correlate nothing)
    windows = [w for w in WINDOWS if w >= (ctx.sample_interval_s or 0)] or [int(ctx.window_s)]
    default = min(range(len(windows)), key=lambda i: abs(windows[i] - ctx.window_s))
    window_s = c1.selectbox("Window (s)", windows, index=default, key="pressure_window")
    x = c2.selectbox("Pressure", list(PRESSURE), format_func=PRESSURE.get, index=3, key="pressure_x")
    y = c3.selectbox("Latency", list(LATENCY), format_func=LATENCY.get, key="pressure_y")
    data = cache.pressure(ctx.url, ctx.since, ctx.until, float(window_s), x, y, ctx.instances)
    frame = data["windows"]
    st.caption(f"{window_s:g} s windows over {ctx.scope()}.")
    if x not in frame or y not in frame or frame[[x, y]].dropna().empty:
        st.info("Not enough data in this range for this pair: it needs instance snapshots or KV events, and requests.")
        return
    st.scatter_chart(frame[[x, y]].dropna(), x=x, y=y, x_label=PRESSURE[x], y_label=LATENCY[y])
    st.subheader("Lagged correlation")
    best = data["strongest"]
    if best is None:
        st.info("The correlation is undefined here (fewer than 3 windows, or a constant series).")
    else:
        lead = "leads" if best["lag"] > 0 else "follows" if best["lag"] < 0 else "moves with"
        st.write(f"Strongest: r = {best['r']:.2f} at lag {int(best['lag'])} ({best['lag_s']:g} s): "
                 f"{PRESSURE[x]} {lead} {LATENCY[y]}.")  # fmt: skip
    st.bar_chart(data["correlation"].set_index("lag_s")["r"], x_label="lag (s): pressure leads latency by", y_label="r")
    show_table(data["correlation"], ctx.clock)
