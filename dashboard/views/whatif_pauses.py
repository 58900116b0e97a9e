"""What-if's "Pauses before steps": each step's hit rate against the pause before it, per tool, and the curve of a
TTL pin (`kvobs.analytics.steps.pauses`)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import show
from kvobs.analytics.steps import default_ttls, not_measured, pin_curve, step_pauses


@st.cache_data(ttl=60, show_spinner=False)
def pauses(url, since, until) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(each step after a pause: `analytics.pauses.step_pauses`, the TTL pin's curve, steps whose usage did not say
    what was cached)."""
    store = cache.get_store(url)
    frame = step_pauses(store.reads.steps(since, until), store.reads.requests(since, until))
    return frame, pin_curve(frame, default_ttls(frame)), not_measured(frame)


def render(ctx) -> None:
    """The hit rate against the pause before each step, per tool, and how long a pin would have to keep a
    session's prefix for its next step to find it."""
    st.subheader("Pauses before steps")
    frame, curve, unknown = pauses(ctx.url, ctx.since, ctx.until)
    if frame.empty:
        st.info("No step follows a pause in this range: the agents' steps are what the pauses are read from.")
        return
    measured = frame.dropna(subset=["hit_rate"])
    charts = [] if measured.empty else [_scatter(measured)]
    long = curve.melt(id_vars=["ttl_s"], value_vars=["step_share", "token_share"], var_name="of", value_name="share")
    if not long.dropna(subset=["share"]).empty:
        charts.append(_pin(long))
    if charts:
        show(alt.hconcat(*charts).resolve_scale(color="independent"), width="content")
    if measured.empty:
        st.info("No step after a pause has a known hit rate: their usage did not say what was cached.")
    st.caption(
        f"{len(frame):,} steps after a pause (from the end of the session's previous request to its step's first "
        "request, as the engine saw the wait)"
        + (
            f"; {unknown:,} of them left out of the hit rates: their usage did not say what was cached"
            if unknown
            else ""
        )
        + ". Hit rate: the step's cached prompt tokens / prompt tokens, as the engine's response said. The pin curve: "
        "the share of those steps whose pause was at most the pin's time, so whose prefix a pin that long would "
        "have kept, given room to keep it (session_ttl above replays that)."
    )


def _scatter(measured: pd.DataFrame):
    return (
        alt.Chart(measured)
        .mark_circle(size=60, opacity=0.7)
        .encode(
            x=alt.X("pause_s:Q", title="pause before the step (s)", scale=alt.Scale(type="log")),
            y=alt.Y("hit_rate:Q", title="step's hit rate", axis=alt.Axis(format="%")),
            color=alt.Color("tool:N", title="tool in the pause"),
            tooltip=["session_id", "step_index", "tool", alt.Tooltip("pause_s:Q", format=".2f"), "hit_rate"],
        )
        .properties(height=220, width=330)
    )


def _pin(long: pd.DataFrame):
    return (
        alt.Chart(long.replace({"step_share": "steps", "token_share": "their prompt tokens"}))
        .mark_line(point=True)
        .encode(
            x=alt.X("ttl_s:Q", title="pin: a session's prefix kept for (s)", scale=alt.Scale(type="log")),
            y=alt.Y("share:Q", title="steps whose pause it covers", axis=alt.Axis(format="%")),
            color=alt.Color("of:N", title="share of"),
        )
        .properties(height=220, width=330)
    )
