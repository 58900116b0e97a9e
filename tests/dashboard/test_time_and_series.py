"""Times as people read them (ISO with the zone, 24-hour axes, units) and windows that tell zero from unknown."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dashboard.clock import Clock, axis_format, duration
from dashboard.context import bucket_for
from dashboard.series import fill_windows, is_empty, window_grid

TS = 1795440059.0496  # 2026-11-23T13:20:59Z


def test_iso_times_carry_the_zone_and_its_offset_at_that_moment():
    assert Clock.named("UTC").iso(TS) == "2026-11-23T13:20:59+00:00"
    berlin = Clock.named("Europe/Berlin")
    assert berlin.iso(TS) == "2026-11-23T14:20:59+01:00"
    assert berlin.iso(TS, ms=True) == "2026-11-23T14:20:59.049+01:00"
    summer = 1784988000.0  # 2026-07-25T14:00:00Z: daylight saving
    assert berlin.iso(summer) == "2026-07-25T16:00:00+02:00" and berlin.offset(summer) == "UTC+02:00"
    assert berlin.label(TS) == "Europe/Berlin, UTC+01:00" and Clock.named("UTC").label(TS) == "UTC"
    assert Clock.named("America/St_Johns").offset(TS) == "UTC-03:30"
    assert berlin.iso(None) == "" and berlin.iso(float("nan")) == ""


def test_the_sidebar_choice_picks_utc_or_the_browsers_zone():
    assert Clock.choose("UTC", "Asia/Tokyo").name == "UTC"
    assert Clock.choose("local", "Asia/Tokyo").iso(TS) == "2026-11-23T22:20:59+09:00"
    server = Clock.choose("local", None)  # the browser did not say: the server's zone
    assert server.iso(TS) == pd.Timestamp(TS, unit="s", tz="UTC").tz_convert(server.zone).floor("s").isoformat()
    assert Clock.named("Not/AZone").name == Clock.server_local().name


def test_wall_clock_milliseconds_draw_the_zones_clock_on_a_utc_scale():
    tokyo = Clock.named("Asia/Tokyo")
    wall = tokyo.wall_ms([TS, TS + 60])
    assert pd.Timestamp(wall[0], unit="ms").strftime("%H:%M:%S") == "22:20:59"
    assert wall[1] - wall[0] == pytest.approx(60_000)


def test_tables_show_times_as_iso_strings_and_leave_other_columns():
    frame = pd.DataFrame({"started_at": [TS, np.nan], "e2e_s": [1.5, 2.0], "session_id": ["a", "b"]})
    shown = Clock.named("Europe/Berlin").table(frame)
    assert shown["started_at"].tolist() == ["2026-11-23T14:20:59+01:00", ""]
    assert shown["e2e_s"].tolist() == [1.5, 2.0] and frame["started_at"].iloc[0] == TS


def test_axis_formats_are_24_hour_and_durations_have_units():
    assert all("%H" in axis_format(span) and "%I" not in axis_format(span) for span in (60, 7200, 86400, 10 * 86400))
    assert [duration(x) for x in (0.0123, 2.414, 185, 7380, None, math.nan)] == [
        "12 ms",
        "2.41 s",
        "3 min 05 s",
        "2 h 03 min",
        "",
        "",
    ]


def test_windows_are_never_shorter_than_the_reporting_interval():
    assert bucket_for(0, 60) == 1.0
    assert bucket_for(0, 60, at_least=5.0) == 5.0  # 5 s scrapes: no 1 s windows
    assert bucket_for(0, 60, at_least=0.5) == 1.0
    assert bucket_for(0, 86400 * 3) == 3600.0  # 72 windows of an hour


def test_missing_windows_are_zero_for_watched_counts_and_gaps_for_samples():
    counts = pd.DataFrame({"capacity": [3.0]}, index=[20.0])
    zero = fill_windows(counts, 0, 50, 10, value=0.0)
    assert zero.index.tolist() == [0, 10, 20, 30, 40, 50] and zero["capacity"].tolist() == [0, 0, 3, 0, 0, 0]
    gaps = fill_windows(pd.DataFrame({"hit_rate": [0.5]}, index=[20.0]), 0, 50, 10, value=np.nan)
    assert gaps["hit_rate"].isna().sum() == 5 and gaps.loc[20.0, "hit_rate"] == 0.5
    assert window_grid(5, 25, 10).tolist() == [0, 10, 20]


def test_empty_and_all_zero_series_are_told_apart():
    assert is_empty(pd.DataFrame()) and is_empty(pd.DataFrame({"x": [np.nan, np.nan]}))
    zeros = pd.DataFrame({"preemptions": [0.0, 0.0, np.nan]})
    assert not is_empty(zeros) and is_empty(zeros, zero_is_empty=True)
    assert not is_empty(pd.DataFrame({"x": [0.0, 1.0]}), zero_is_empty=True)
