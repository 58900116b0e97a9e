"""Time-series charts that do not mislead: one x-range and one clock for a whole page, a unit on every axis,
gaps where data is missing (lines break at NaN), and a one-line empty state instead of a bare axis.

    axis = TimeAxis(clock, since, until)
    time_chart(frame, axis, y_title="blocks / s", empty="No block was lost in this range.", mark="area")

`frame` is indexed by epoch seconds (a window's start, or a sample's time); each column is a series. What is zero
and what is unknown is decided before (`dashboard.series.fill_windows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st

from dashboard import glossary
from dashboard.clock import Clock, axis_format
from dashboard.series import is_empty

SERIES, VALUE, WALL, END, WHEN = "series", "value", "wall_ms", "end_ms", "time"

# Altair checks every schema object it builds, and every chart's whole spec, against Vega-Lite's JSON schema: about
# a tenth of a page's render (bench/dashboard_queries.py; the Overview draws eight charts). The pages' specs are
# checked against that schema in the tests instead (tests/dashboard/test_chart_specs.py), so a served page skips it.
alt.utils.schemapi.disable_debug_mode()  # no check as each schema object is built


def show(chart, **kwargs) -> None:
    """`st.altair_chart(chart, **kwargs)`, the spec not checked again as Streamlit turns it into a dict."""
    object.__setattr__(chart, "to_dict", partial(chart.to_dict, validate=False))  # Altair's own setattr keeps spec keys
    st.altair_chart(chart, **kwargs)


@dataclass(frozen=True)
class TimeAxis:
    """The x-axis every time chart on a page shares: the page's range, in the page's clock."""

    clock: Clock
    since: float
    until: float

    def encoding(self, field: str = WALL) -> alt.X:
        return time_x(field, self.clock, self.since, self.until)


TICK_STEPS_S = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    172800,
    604800,
)


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


def time_chart(
    frame: pd.DataFrame,
    axis: TimeAxis,
    *,
    y_title: str,
    empty: str,
    mark: str = "line",
    window_s: float | None = None,
    zero_is_empty: bool = False,
    y_format: str | None = None,
    height: int = 280,
    points: pd.Series | None = None,
) -> bool:
    """Draw `frame` (mark: line, step (a value held until the next sample), area (stacked), bar (stacked, one bar per
    window, `window_s` wide)), with `points` (values indexed by epoch s: one dot each) over it; or say `empty`.
    Returns whether a chart was drawn.

    For counts (bar, area), a window whose value is 0 was watched and nothing happened: it is drawn as a grey tick on
    the axis, not as a bar; a window that is NaN was not watched and is left blank."""
    has_points = points is not None and not points.dropna().empty
    if (frame.empty or is_empty(frame, zero_is_empty=zero_is_empty)) and not has_points:
        st.info(empty)
        return False
    frame = frame.loc[:, frame.notna().any()].rename(columns=series_name)  # a series with no value: no legend entry
    long = _long(frame, axis.clock, window_s) if len(frame.columns) else pd.DataFrame(columns=[WALL, SERIES, VALUE])
    encodings = _encodings(axis, y_title, y_format, series="series", stack=mark == "area")
    if len(frame.columns) > 1 or mark in ("area", "bar") or has_points:
        encodings["color"] = alt.Color(f"{SERIES}:N", title=None, legend=alt.Legend(orient="top", labelLimit=400))
    layers, ticks = [], None
    if has_points and points is not None:
        dots = _long(points.dropna().rename(series_name(points.name)).to_frame(), axis.clock, None)
        layers.append(alt.Chart(dots).mark_circle(size=26, opacity=0.55).encode(**encodings))
    if mark in ("bar", "area"):
        ticks = _quiet_windows(long, axis)
    if mark == "bar":  # stacked here: Vega-Lite draws a bar with x and x2 as a thin ranged bar, not from zero
        long = long[long[VALUE].fillna(0) != 0].copy()
        long["top"] = long.groupby(WALL)[VALUE].cumsum()
        long["bottom"] = long["top"] - long[VALUE]
        encodings.update(
            y=_encodings(axis, y_title, y_format, series="series", stack=False, field="top")["y"], y2="bottom:Q"
        )
        chart = alt.Chart(long).mark_rect(opacity=0.9).encode(x2=f"{END}:Q", **encodings)
    elif mark == "area":
        chart = alt.Chart(long).mark_area(interpolate="step-after", opacity=0.8).encode(**encodings)
    else:
        chart = (
            alt.Chart(long)
            .mark_line(point=alt.OverlayMarkDef(size=16), interpolate="step-after" if mark == "step" else "linear")
            .encode(**encodings)
        )
    show(alt.layer(chart, *layers, *([ticks] if ticks else [])).properties(height=height), width="stretch")
    if ticks:
        st.caption("Grey ticks on the axis: windows watched with nothing in them; a blank window was not watched.")
    return True


def _quiet_windows(long: pd.DataFrame, axis: TimeAxis):
    """A layer of grey ticks at 0 for the windows whose counts are all 0 (watched, nothing happened), or None."""
    windows = long.groupby(WALL)
    totals = pd.DataFrame({"total": windows[VALUE].sum(min_count=1), WHEN: windows[WHEN].first()}).reset_index()
    quiet = totals[totals["total"] == 0]
    if quiet.empty:
        return None
    return (
        alt.Chart(quiet.assign(zero=0.0))
        .mark_tick(color="#9e9e9e", thickness=2, size=8)
        .encode(
            x=axis.encoding(),
            y=alt.Y("zero:Q"),
            tooltip=[
                alt.Tooltip(f"{WHEN}:N", title=f"time ({axis.clock.name})"),
                alt.Tooltip("zero:Q", title="watched, nothing happened"),
            ],
        )
    )


def series_name(name) -> str:
    """A legend's name for a series (a column of a page's frame)."""
    return glossary.series(name)


def small_multiples(
    frame: pd.DataFrame,
    axis: TimeAxis,
    *,
    y_title: str,
    empty: str,
    y_format: str | None = None,
    columns: int = 3,
    width: int = 300,
    height: int = 130,
) -> bool:
    """One small line chart per column of `frame` (an instance), all on the page's x-range and one y-scale, so
    the instances compare at a glance; or say `empty`. Returns whether a chart was drawn."""
    if frame.empty or is_empty(frame):
        st.info(empty)
        return False
    long = _long(frame, axis.clock, None)
    encodings = _encodings(axis, y_title, y_format, series="instance", stack=False)
    chart = alt.Chart(long).mark_line(point=alt.OverlayMarkDef(size=12)).encode(**encodings)
    header = alt.Header(labelFontSize=13, labelFontWeight="bold", labelOrient="top")
    show(
        chart.properties(width=width, height=height).facet(
            facet=alt.Facet(f"{SERIES}:N", title=None, header=header), columns=columns
        ),
        width="content",
    )
    return True


def _encodings(
    axis: TimeAxis, y_title: str, y_format: str | None, *, series: str, stack: bool, field: str = VALUE
) -> dict:
    """x on the page's axis, y with its unit (stacked or not; the title above the axis, level, so it is never cut
    to the plot's height), and the tooltip: time, the series (named `series`), the value."""
    title: dict[str, Any] = {
        "title": y_title,
        "titleAngle": 0,
        "titleAlign": "left",
        "titleAnchor": "end",
        "titleY": -12,
        "titleX": 0,
        "titleLimit": 0,
    }
    y = alt.Y(
        f"{field}:Q",
        stack="zero" if stack else None,
        axis=alt.Axis(format=y_format, **title) if y_format else alt.Axis(**title),
    )
    tooltip = [
        alt.Tooltip(f"{WHEN}:N", title=f"time ({axis.clock.name})"),
        alt.Tooltip(f"{SERIES}:N", title=series),
        alt.Tooltip(f"{VALUE}:Q", title=y_title, format=y_format or ",.4~g"),
    ]
    return {"x": axis.encoding(), "y": y, "tooltip": tooltip}


def _long(frame: pd.DataFrame, clock: Clock, window_s: float | None) -> pd.DataFrame:
    ts = frame.index.to_numpy(float)
    wall, when = clock.wall_ms(ts), [clock.iso(t) for t in ts]  # once for every series
    end = clock.wall_ms(ts + window_s) if window_s else None
    parts = []
    for name in frame.columns:
        part = pd.DataFrame({WALL: wall, SERIES: str(name), VALUE: frame[name].to_numpy(dtype=float)})
        if end is not None:
            part[END] = end
        part[WHEN] = when
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    return out.replace([np.inf, -np.inf], np.nan)
