"""Event dispatch by table: each observer maps engine event types to its handlers once, in its class body.

    class Tally:
        def _evicted(self, event: ev.BlockEvicted) -> None: ...
        HANDLERS = {ev.BlockEvicted: _evicted}

    dispatch(tally, Tally.HANDLERS, result.events)

An event type missing from a table is of no interest to that observer and is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from instrumented_engine.engine.events import KVEvent

Handlers = Mapping[type[KVEvent], Callable[[Any, Any], None]]


def dispatch(observer: object, handlers: Handlers, events: Iterable[KVEvent]) -> None:
    """Call `observer`'s handler for each event that has one, in order."""
    for event in events:
        handler = handlers.get(type(event))
        if handler is not None:
            handler(observer, event)
