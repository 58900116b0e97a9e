"""Waiting for something another thread or process does, with a deadline."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float = 20.0, poll_s: float = 0.02) -> None:
    """Return once `predicate()` is true; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(poll_s)
