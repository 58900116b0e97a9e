"""Time-series charts that do not mislead: one x-range and one clock for a whole page, a unit on every axis,
gaps where data is missing (lines break at NaN), and a one-line empty state instead of a bare axis.

    axis = TimeAxis(clock, since, until)
    time_chart(frame, axis, y_title="blocks / s", empty="No block was lost in this range.", mark="area")

`frame` is indexed by epoch seconds (a window's start, or a sample's time); each column is a series. What is zero
and what is unknown is decided before (`dashboard.series.fill_windows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from dashboard.clock import Clock, axis_format
from dashboard.series import is_empty

SERIES, VALUE, WALL, END, WHEN = "series", "value", "wall_ms", "end_ms", "time"


@dataclass(frozen=True)
class TimeAxis:
    """The x-axis every time chart on a page shares: the page's range, in the page's clock."""

    clock: Clock
    since: float
    until: float

    def encoding(self, field: str = WALL) -> alt.X:
        return time_x(field, self.clock, self.since, self.until)


TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800,
                604800)  # fmt: skip


def time_x(field: str, clock: Clock, since: float, until: float, *, ticks: int = 7, ms: bool = False) -> alt.X:
    """An x encoding of `field` (wall-clock ms, `Clock.wall_ms`) over [since, until]: a plain number scale with
    round ticks labelled on a 24-hour clock. Not a Vega time scale: Streamlit hands naive datetimes to the browser
    as the browser's local time, and a time scale formats in the browser's zone, not the zone chosen here."""
    low, high = clock.wall_ms([since, until])
    high = max(high, low + 1000.0)
    step_ms = 1000.0 * next((s for s in TICK_STEPS_S if (high - low) / (1000.0 * s) <= ticks), TICK_STEPS_S[-1])
    values = np.arange(np.ceil(low / step_ms) * step_ms, high + 1, step_ms).tolist()
    fmt = axis_format(until - since) + (".%L" if ms else "")
    axis = alt.Axis(values=values, labelExpr=f"utcFormat(datum.value, '{fmt}')", title=f"time ({clock.label(until)})")
    return alt.X(f"{field}:Q", scale=alt.Scale(domain=[low, high], nice=False, zero=False), axis=axis)


def time_chart(frame: pd.DataFrame, axis: TimeAxis, *, y_title: str, empty: str, mark: str = "line",
               window_s: float | None = None, zero_is_empty: bool = False, y_format: str | None = None,
               height: int = 220) -> bool:  # fmt: skip
    """Draw `frame` (mark: line, area (stacked), bar (one bar per window, `window_s` wide)); or say `empty`.
    Returns whether a chart was drawn."""
    if frame.empty or is_empty(frame, zero_is_empty=zero_is_empty):
        st.info(empty)
        return False
    long = _long(frame, axis.clock, window_s)
    encodings = _encodings(axis, y_title, y_format, series="series", stack=mark in ("area", "bar"))
    if len(frame.columns) > 1 or mark != "line":
        encodings["color"] = alt.Color(f"{SERIES}:N", title=None, legend=alt.Legend(orient="bottom"))
    if mark == "bar":
        chart = alt.Chart(long).mark_bar().encode(x2=f"{END}:Q", **encodings)
    elif mark == "area":
        chart = alt.Chart(long).mark_area(interpolate="step-after", opacity=0.8).encode(**encodings)
    else:
        chart = alt.Chart(long).mark_line(point=alt.OverlayMarkDef(size=16)).encode(**encodings)
    st.altair_chart(chart.properties(height=height), width="stretch")
    return True


def small_multiples(frame: pd.DataFrame, axis: TimeAxis, *, y_title: str, empty: str, y_format: str | None = None,
                    columns: int = 3, width: int = 300, height: int = 130) -> bool:  # fmt: skip
    """One small line chart per column of `frame` (an instance), all on the page's x-range and one y-scale, so
    the instances compare at a glance; or say `empty`. Returns whether a chart was drawn."""
    if frame.empty or is_empty(frame):
        st.info(empty)
        return False
    long = _long(frame, axis.clock, None)
    encodings = _encodings(axis, y_title, y_format, series="instance", stack=False)
    chart = alt.Chart(long).mark_line(point=alt.OverlayMarkDef(size=12)).encode(**encodings)
    header = alt.Header(labelFontSize=13, labelFontWeight="bold", labelOrient="top")
    st.altair_chart(chart.properties(width=width, height=height).facet(
        facet=alt.Facet(f"{SERIES}:N", title=None, header=header), columns=columns), width="content")  # fmt: skip
    return True


def _encodings(axis: TimeAxis, y_title: str, y_format: str | None, *, series: str, stack: bool) -> dict:
    """x on the page's axis, y with its unit (stacked or not), and the tooltip: time, the series (named `series`),
    the value."""
    y = alt.Y(f"{VALUE}:Q", title=y_title, stack="zero" if stack else None,
              axis=alt.Axis(format=y_format) if y_format else alt.Axis())  # fmt: skip
    tooltip = [alt.Tooltip(f"{WHEN}:N", title=f"time ({axis.clock.name})"), alt.Tooltip(f"{SERIES}:N", title=series),
               alt.Tooltip(f"{VALUE}:Q", title=y_title, format=y_format or ",.4~g")]  # fmt: skip
    return {"x": axis.encoding(), "y": y, "tooltip": tooltip}


def _long(frame: pd.DataFrame, clock: Clock, window_s: float | None) -> pd.DataFrame:
    ts = frame.index.to_numpy(float)
    parts = []
    for name in frame.columns:
        part = pd.DataFrame({WALL: clock.wall_ms(ts), SERIES: str(name), VALUE: frame[name].to_numpy(dtype=float)})
        if window_s:
            part[END] = clock.wall_ms(ts + window_s)
        part[WHEN] = [clock.iso(t) for t in ts]
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    return out.replace([np.inf, -np.inf], np.nan)
