"""Pressure vs latency: a scatter of one pressure measure against one latency per window, and their lagged
correlation, named only when enough windows make it more than chance (`kvobs.analytics.samples`)."""

from __future__ import annotations

import altair as alt
import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import show
from dashboard.views.tables import show_table
from kvobs.analytics.cache import why_no_lag
from kvobs.analytics.samples import MIN_PAIRS

TITLE = "Pressure vs latency"
PRESSURE = {
    "usage_mean": "KV usage, mean (pinned share)",
    "usage_max": "KV usage, peak (pinned share)",
    "resident_blocks": "resident cached blocks",
    "evictions_per_s": "blocks lost per second",
    "preemptions": "preemptions per window",
    "waiting": "waiting requests",
}
LATENCY = {
    "ttft_mean": "TTFT, mean (s)",
    "ttft_p90": "TTFT p90 (s)",
    "ttft_p50": "TTFT p50 (s)",
    "itl_p90": "inter-token p90 (s)",
    "itl_p50": "inter-token p50 (s)",
    "queue_p90": "queue p90 (s)",
}
WINDOWS = (5, 10, 30, 60, 300, 900)


def render(ctx) -> None:
    st.header(TITLE)
    c1, c2, c3 = st.columns(3)
    # never a window shorter than the instances' reporting interval (mostly empty windows correlate nothing)
    windows = [w for w in WINDOWS if w >= (ctx.sample_interval_s or 0)] or [int(ctx.window_s)]
    default = min(range(len(windows)), key=lambda i: abs(windows[i] - ctx.window_s))
    window_s = c1.selectbox("Window (s)", windows, index=default, key="pressure_window")
    x = c2.selectbox("Pressure", list(PRESSURE), format_func=PRESSURE.__getitem__, index=3, key="pressure_x")
    y = c3.selectbox("Latency", list(LATENCY), format_func=LATENCY.__getitem__, key="pressure_y")
    if x is None or y is None:  # (a select box with options always has a choice)
        return
    data = cache.pressure(ctx.url, ctx.since, ctx.until, float(window_s), x, y, instances=ctx.instances)
    frame = data.windows
    ctx.runs_note()
    st.caption(
        f"{window_s:g} s windows over {ctx.scope()}. A latency percentile is shown for a window with enough "
        "requests for it (p50: 5, p90: 10, p99: 100); a mean for any."
    )
    if x not in frame or y not in frame or frame[[x, y]].dropna().empty:
        st.info(
            "Not enough data in this range for this pair: it needs instance snapshots or KV events, and windows "
            "with enough requests for this latency."
        )
        return
    pairs = frame[[x, y, "requests"]].dropna(subset=[x, y]) if "requests" in frame else frame[[x, y]].dropna()
    scatter = (
        alt.Chart(pairs)
        .mark_circle(size=60, opacity=0.7)
        .encode(
            x=alt.X(f"{x}:Q", title=PRESSURE[x]),
            y=alt.Y(f"{y}:Q", title=LATENCY[y]),
            tooltip=[
                alt.Tooltip(f"{x}:Q", title=PRESSURE[x], format=".3g"),
                alt.Tooltip(f"{y}:Q", title=LATENCY[y], format=".3f"),
                *([alt.Tooltip("requests:Q", title="requests in the window")] if "requests" in pairs else []),
            ],
        )
    )
    show(scatter.properties(height=300), width="stretch")
    st.caption(f"{len(pairs):,} windows with both values.")
    st.subheader("Lagged correlation")
    correlation, best = data.correlation, data.strongest
    if best is None:
        st.info(why_no_lag(correlation))
    else:
        lead = "leads" if best["lag"] > 0 else "follows" if best["lag"] < 0 else "moves with"
        st.markdown(
            f"**Strongest:** r = {best['r']:.2f} (95% interval {best['ci_low']:.2f} to {best['ci_high']:.2f}; "
            f"p = {best['p_adjusted']:.3f} after testing {int(correlation['r'].notna().sum())} lags; "
            f"{int(best['pairs'])} windows) at lag {int(best['lag']):+d} ({best['lag_s']:+g} s): "
            f"{PRESSURE[x]} {lead} {LATENCY[y]}."
        )
        st.caption("Consecutive windows are not independent: read this as a lead to look at, not proof.")
    shown = correlation.dropna(subset=["r"])
    if not shown.empty:
        base = alt.Chart(shown).encode(x=alt.X("lag_s:O", title="lag (s): positive, pressure leads latency"))
        bars = base.mark_bar().encode(
            y=alt.Y("r:Q", title="r", scale=alt.Scale(domain=[-1, 1])),
            tooltip=["lag_s", alt.Tooltip("r:Q", format=".2f"), "pairs"],
        )
        ranges = base.mark_rule(color="#555").encode(y="ci_low:Q", y2="ci_high:Q")
        show(alt.layer(bars, ranges).properties(height=220), width="stretch")
        st.caption(f"Bars: r at each lag with at least {MIN_PAIRS} windows; lines: its 95% interval.")
    show_table(correlation, ctx.clock)
