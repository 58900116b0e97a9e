"""Times as people read them: ISO 8601 in one zone with its UTC offset, a 24-hour clock, durations with units.

The store keeps UTC epoch seconds. The sidebar chooses the zone: the viewer's own (the browser's, through
`st.context.timezone`; the server's when the browser does not say) or UTC. Every table and chart axis on a page
goes through one `Clock`, so a page never mixes zones.

    clock = Clock.named("Europe/Berlin")
    clock.iso(1795440059.0496)        # '2026-11-23T14:20:59+01:00'
    clock.wall_ms(ts_series)          # wall-clock milliseconds for a chart drawn on a UTC scale
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import pandas as pd

ZONES = ("local", "UTC")
# Columns holding epoch seconds in the frames pages show (schema columns and the analytics' own).
TIME_COLUMNS = (
    "ts",
    "started_at",
    "ended_at",
    "arrival_ts",
    "first_token_ts",
    "finished_ts",
    "first_ts",
    "last_ts",
    "since",
    "until",
    "time",
)


@dataclass(frozen=True)
class Clock:
    zone: tzinfo
    name: str  # "UTC", an IANA name ("Europe/Berlin"), or the server's abbreviation ("CET")

    @classmethod
    def named(cls, name: str | None) -> Clock:
        """The zone `name` (IANA); the server's local zone when `name` is None or unknown."""
        if name in (None, "", "UTC", "Etc/UTC"):
            return cls(timezone.utc, "UTC") if name else cls.server_local()
        try:
            return cls(ZoneInfo(name), name)
        except (ZoneInfoNotFoundError, ValueError):
            return cls.server_local()

    @classmethod
    def server_local(cls) -> Clock:
        zone = datetime.now().astimezone().tzinfo or timezone.utc  # (astimezone always sets one)
        return cls(zone, zone.tzname(None) or "local")

    @classmethod
    def choose(cls, choice: str, browser_zone: str | None) -> Clock:
        """The sidebar's choice: "UTC", or "local" (the browser's zone, else the server's)."""
        return cls(timezone.utc, "UTC") if choice == "UTC" else cls.named(browser_zone)

    def at(self, ts: float) -> datetime:
        return datetime.fromtimestamp(float(ts), self.zone)

    def iso(self, ts, *, ms: bool = False) -> str:
        """`2026-11-23T14:20:59+01:00` (with milliseconds when `ms`); empty for a missing time."""
        if ts is None or (isinstance(ts, float) and np.isnan(ts)):
            return ""
        return self.at(ts).isoformat(timespec="milliseconds" if ms else "seconds")

    def offset(self, ts: float) -> str:
        """`UTC+01:00` at `ts` (a zone's offset changes with daylight saving)."""
        delta = self.at(ts).utcoffset() or timedelta(0)
        sign = "-" if delta < timedelta(0) else "+"
        minutes = abs(int(delta.total_seconds())) // 60
        return f"UTC{sign}{minutes // 60:02d}:{minutes % 60:02d}"

    def label(self, ts: float) -> str:
        """The zone as an axis or caption says it: `Europe/Berlin, UTC+01:00`, or `UTC`."""
        return "UTC" if self.name == "UTC" else f"{self.name}, {self.offset(ts)}"

    def wall_ms(self, ts) -> np.ndarray:
        """Wall-clock time in this zone as milliseconds since 1970 read as UTC: what a chart drawn on a UTC time
        scale shows as this zone's clock, whatever the browser's own zone."""
        seconds = np.atleast_1d(np.asarray(ts, dtype=float))
        offsets = np.array(
            [(self.at(s).utcoffset() or timedelta(0)).total_seconds() if np.isfinite(s) else 0.0 for s in seconds]
        )
        return (seconds + offsets) * 1000.0

    def table(self, frame: pd.DataFrame, *, ms: bool = False) -> pd.DataFrame:
        """`frame` with its epoch-seconds columns (`TIME_COLUMNS`) as ISO strings in this zone."""
        out = frame.copy()
        for column in TIME_COLUMNS:
            if column not in out:
                continue
            values = out[column]
            if not pd.api.types.is_numeric_dtype(values):  # numbers held as objects (a frame concatenated from parts)
                numbers = pd.to_numeric(values, errors="coerce")
                if numbers.notna().sum() != values.notna().sum():
                    continue  # text already
                values = numbers
            out[column] = [self.iso(v, ms=ms) if pd.notna(v) else "" for v in values]
        return out


def axis_format(span_s: float) -> str:
    """A 24-hour d3 time format fitting a range of `span_s` seconds."""
    if span_s <= 6 * 3600:
        return "%H:%M:%S"
    if span_s <= 2 * 86400:
        return "%H:%M"
    return "%m-%d %H:%M"


def duration(seconds) -> str:
    """`850 ms`, `2.41 s`, `3 min 05 s`, `2 h 03 min`; empty for a missing value."""
    if seconds is None or not np.isfinite(seconds):
        return ""
    if abs(seconds) < 1:
        return f"{seconds * 1000:.0f} ms"
    if abs(seconds) < 60:
        return f"{seconds:.2f} s"
    if abs(seconds) < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
