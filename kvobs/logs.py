"""Rate-limited logging of repeated failures: the 1st, 10th, 100th, then every 1000th occurrence."""

from __future__ import annotations


def worth_logging(count: int, every: int = 1000) -> bool:
    """True when a failure counter that just reached `count` should be logged."""
    return count in (1, 10, 100) or count % every == 0
