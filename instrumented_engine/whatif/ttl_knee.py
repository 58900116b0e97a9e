"""Where a longer pin stops paying: the knee of the hit rate against session_ttl's TTL at one cache size, from a sweep
(`kvobs whatif --policy session_ttl --ttl 0,60,300,3600`).

    knee([(0, 0.40), (60, 0.47), (300, 0.50), (3600, 0.505)])   # 300: the shortest TTL with 90% of the gain

The gain is from the shortest TTL swept to the best hit rate (not the longest TTL's: a pin held too long can cost the
other sessions more than it saves the paused ones). Fewer than three TTLs have no bend to mark, and a sweep in which
no TTL gains anything has no knee either: each is said as such, never as a TTL.
"""

from __future__ import annotations

KNEE_SHARE = 0.9  # of the sweep's gain: where the knee is


def _measured(points: list[tuple[float, float | None]]) -> list[tuple[float, float]]:
    """The points with a hit rate, shortest TTL first."""
    return sorted((ttl, rate) for ttl, rate in points if rate is not None)


def knee(points: list[tuple[float, float | None]]) -> float | None:
    """The shortest TTL whose hit rate reaches `KNEE_SHARE` of the gain from the shortest TTL to the best one; None
    with fewer than three measured points or no gain. `points`: (TTL s, hit rate or None where nothing was asked)."""
    measured = _measured(points)
    if len(measured) < 3:
        return None
    first, best = measured[0][1], max(rate for _, rate in measured)
    if best <= first:
        return None
    return next(ttl for ttl, rate in measured if rate - first >= KNEE_SHARE * (best - first))


def knee_words(num_blocks: int, points: list[tuple[float, float | None]]) -> str:
    """The knee of one size's sweep, said with what it was read from."""
    measured = _measured(points)
    if len(measured) < 3:
        return f"{num_blocks:,} blocks: {len(measured)} TTL(s) measured, too few to mark a knee (give three or more)"
    found = knee(points)
    lowest, best = measured[0], max(measured, key=lambda p: p[1])
    if found is None:
        return f"{num_blocks:,} blocks: no TTL gains anything over {lowest[0]:g} s (hit rate {lowest[1]:.1%})"
    return (
        f"{num_blocks:,} blocks: knee at {found:g} s, the shortest TTL with {KNEE_SHARE:.0%} of the gain from "
        f"{lowest[0]:g} s ({lowest[1]:.1%}) to the best, {best[0]:g} s ({best[1]:.1%})"
    )
