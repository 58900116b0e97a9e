"""Times as people read them on a terminal or in a log line: local ISO 8601 with the zone's offset."""

from __future__ import annotations

from datetime import datetime


def local_time(ts: float) -> str:
    """Epoch seconds as local ISO 8601 with the zone's offset (`2026-11-24T23:06:40+01:00`)."""
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
