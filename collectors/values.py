"""Values read leniently from what others wrote (agent span attributes, Dynamo's JSON rows): a value of the wrong
type or out of range reads as not given, never as an error; an id is cut to the store's length (`clip_id`)."""

from __future__ import annotations

from kvobs.identifiers import clip_id


def text(value) -> str | None:
    """A string or integer as an id (None: absent, empty or another type)."""
    if value is None or isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return clip_id(str(value)) or None


def count(value) -> int | None:
    """A non-negative integer that fits the store's INTEGER columns (None otherwise)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31 else None
