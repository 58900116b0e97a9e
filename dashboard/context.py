"""What every page is given: the store, the time range, its window, the clock, the instances, and the Jaeger link;
and the sidebar's range, zone and instance choices that make them.

The range is relative to the newest time in the store (an observed row or an alert evaluated after it), so a
recorded store reads the same as a live one. A window is never shorter than the interval the instances report
at (a 1 s window over 5 s scrapes is mostly empty windows, which read as zeros or gaps that are not there).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pandas as pd
import streamlit as st

from dashboard.clock import ZONES, Clock
from dashboard.views.charts import TimeAxis
from kvobs.analytics.runs import describe, restarted

RANGES = {
    "everything": None,
    "last 15 minutes": 900,
    "last hour": 3600,
    "last 6 hours": 21600,
    "last 24 hours": 86400,
    "custom": None,
}
STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)


@dataclass(frozen=True)
class Context:
    url: str
    since: float
    until: float
    window_s: float
    jaeger_url: str | None
    clock: Clock
    sample_interval_s: float | None = None  # the instances' reporting interval (median), None without snapshots
    instances: tuple[str, ...] | None = None  # the instances chosen; None: the whole fleet
    fleet: tuple[str, ...] = ()  # every instance in the store
    runs: pd.DataFrame | None = None  # the engine runs the range holds, of the instances shown (`analytics.runs`)
    run_chosen: bool = False  # the sidebar narrowed the range to one run

    @property
    def shown_instances(self) -> tuple[str, ...]:
        return self.fleet if self.instances is None else self.instances

    @property
    def axis(self) -> TimeAxis:
        return TimeAxis(self.clock, self.since, self.until)

    def window_caption(self) -> str:
        text = f"{self.window_s:g} s windows"
        if self.sample_interval_s:
            text += f" (instances report every {self.sample_interval_s:.3g} s; no window is shorter)"
        return text + f"; times in {self.clock.label(self.until)}; {self.scope()}."

    def restarted(self) -> list[str]:
        """Instances that restarted inside the range (more than one run of theirs in it)."""
        return restarted(self.runs) if self.runs is not None and not self.run_chosen else []

    def runs_note(self) -> None:
        """Say so when the range spans a restart: counts add over the runs, a replay takes them one by one."""
        if self.runs is not None and self.restarted():
            shown = self.runs[self.runs["instance"].isin(self.restarted())]
            st.warning(
                f"This range spans engine restarts: {describe(shown, self.clock.iso)}. Each run began with an "
                "empty cache: counts and the hit rate add over the runs, What-if replays each run on its own. "
                "Choose one run in the sidebar to look at it alone."
            )

    def scope(self) -> str:
        """Which instances the page counts, in words."""
        if len(self.fleet) <= 1:
            return f"instance {self.fleet[0]}" if self.fleet else "no instance has reported"
        if self.instances is None:
            return f"all {len(self.fleet)} instances"
        return f"{len(self.instances)} of {len(self.fleet)} instances ({', '.join(self.instances)})"


def bucket_for(since: float, until: float, *, points: int = 120, at_least: float | None = None) -> float:
    """A round window length giving at most about `points` windows over the range, and not below `at_least`."""
    span = max(until - since, 1.0)
    floor = at_least or 0.0
    for step in STEPS_S:
        if span / step <= points and step >= floor:
            return float(step)
    return float(STEPS_S[-1])


def choose_clock() -> Clock:
    choice = st.sidebar.radio(
        "Times in",
        ZONES,
        horizontal=True,
        key="zone",
        help="local: this browser's time zone. Every time on every page uses it.",
    )
    return Clock.choose(choice, st.context.timezone)


def choose_range(first: float, last: float, clock: Clock) -> tuple[float, float]:
    """The sidebar's range within [first, last]: a span ending at `last`, everything, or a custom slider."""
    name = st.sidebar.selectbox("Time range", list(RANGES), key="range")
    if name == "custom":
        low, high = _wall(first, clock), _wall(last, clock) + timedelta(seconds=1)
        chosen = st.sidebar.slider(
            "From, to",
            min_value=low,
            max_value=high,
            value=(low, high),
            key="custom_range",
            step=timedelta(seconds=1),
            format="YYYY-MM-DD HH:mm:ss",
        )
        since, until = (_epoch(w, clock) for w in chosen)
        return max(first, since), min(last, until)
    span = RANGES[name]
    return (first if span is None else max(first, last - span)), last


def choose_instances(fleet: list[str]) -> tuple[str, ...] | None:
    """The sidebar's instances (`?instance=a&instance=b` preselects); None when the whole fleet is chosen."""
    if len(fleet) <= 1:
        return None
    asked = [name for name in st.query_params.get_all("instance") if name in fleet]
    if "instances" not in st.session_state:
        st.session_state["instances"] = asked or list(fleet)
    chosen = st.sidebar.multiselect(
        "Instances",
        fleet,
        key="instances",
        placeholder="all instances",
        help="Count only these instances' snapshots, requests and KV events (agent "
        "steps and sessions are the fleet's: a session may use any instance). "
        "None chosen: all.",
    )
    return None if not chosen or set(chosen) == set(fleet) else tuple(name for name in fleet if name in chosen)


def _wall(ts: float, clock: Clock) -> datetime:
    return clock.at(ts).replace(tzinfo=None, microsecond=0)


def _epoch(wall: datetime, clock: Clock) -> float:
    return wall.replace(tzinfo=clock.zone).timestamp()


ALL_RUNS = "all runs in the range"


def choose_run(runs: pd.DataFrame, clock: Clock, single_instance: bool) -> pd.Series | None:
    """The sidebar's run, when some instance restarted in the range (`runs`: those it holds): one run, or all of them.
    A single instance's latest run is the default (one cache, one story); a fleet's, all runs. `?run=ID`
    preselects."""
    if runs is None or not restarted(runs):
        return None
    ordered = runs.sort_values("started_at", ascending=False).reset_index(drop=True)
    options = [ALL_RUNS, *ordered["run_id"]]
    asked = st.query_params.get("run")
    default = options.index(asked) if asked in options else (1 if single_instance else 0)
    latest = set(ordered.groupby("instance")["run_id"].first())

    one_day = len({clock.at(t).date() for t in ordered["started_at"]}) == 1
    short = "%H:%M:%S" if one_day else "%m-%d %H:%M"

    def named(option: str) -> str:
        if option == ALL_RUNS:
            return f"all {len(ordered)} runs in the range"
        row = ordered[ordered["run_id"] == option].iloc[0]
        started = clock.at(row["started_at"]).strftime(short)
        return f"{row['instance']} from {started}" + (" (latest)" if option in latest else "")

    choice = st.sidebar.selectbox(
        "Run",
        options,
        index=default,
        format_func=named,
        key="run",
        help="Each engine start (a replica restart) began with an empty cache: a run. "
        "One run at a time reads as one cache; all runs add their counts.",
    )
    return None if choice == ALL_RUNS else ordered[ordered["run_id"] == choice].iloc[0]
