"""What every page is given: the store, the time range, its window, the clock, the instances, and the Jaeger link;
and the sidebar's range, zone and instance choices that make them.

The range is relative to the newest time in the store (an observed row or an alert evaluated after it), so a
recorded store reads the same as a live one. A window is never shorter than the interval the instances report
at (a 1 s window over 5 s scrapes is mostly empty windows, which read as zeros or gaps that are not there).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import streamlit as st

from dashboard.clock import ZONES, Clock
from dashboard.views.charts import TimeAxis

RANGES = {"everything": None, "last 15 minutes": 900, "last hour": 3600, "last 6 hours": 21600,
          "last 24 hours": 86400, "custom": None}  # fmt: skip
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
    choice = st.sidebar.radio("Times in", ZONES, horizontal=True, key="zone",
                              help="local: this browser's time zone. Every time on every page uses it.")  # fmt: skip
    return Clock.choose(choice, st.context.timezone)


def choose_range(first: float, last: float, clock: Clock) -> tuple[float, float]:
    """The sidebar's range within [first, last]: a span ending at `last`, everything, or a custom slider."""
    name = st.sidebar.selectbox("Time range", list(RANGES), key="range")
    if name == "custom":
        low, high = _wall(first, clock), _wall(last, clock) + timedelta(seconds=1)
        chosen = st.sidebar.slider("From, to", min_value=low, max_value=high, value=(low, high), key="custom_range",
                                   step=timedelta(seconds=1), format="YYYY-MM-DD HH:mm:ss")  # fmt: skip
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
    chosen = st.sidebar.multiselect("Instances", fleet, key="instances", placeholder="all instances",
                                    help="Count only these instances' snapshots, requests and KV events (agent "
                                    "steps and sessions are the fleet's: a session may use any instance). "
                                    "None chosen: all.")  # fmt: skip
    return None if not chosen or set(chosen) == set(fleet) else tuple(name for name in fleet if name in chosen)


def _wall(ts: float, clock: Clock) -> datetime:
    return clock.at(ts).replace(tzinfo=None, microsecond=0)


def _epoch(wall: datetime, clock: Clock) -> float:
    return wall.replace(tzinfo=clock.zone).timestamp()
