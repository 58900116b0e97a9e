"""When each cached block of one tier was stored, and when each recently lost one was lost: what a loss row's
`lifetime_s` and a store row's `restored` / `restored_after_s` are written from as the rows are made, so that no
read has to look a block up by its hash among the stored rows.

    clock = BlockClock()
    clock.stored([h1, h2], 10.0)     # None: neither was lost here before (within the horizon)
    clock.lost([h2], 25.0)           # [15.0]: h2 lived 15 s (stored at 10.0)
    clock.stored([h2], 40.0)         # [15.0]: h2 came back 15 s after its loss (a restore)
    clock.cleared(50.0)              # every resident block lost at 50.0

One clock per instance, tier and KV-cache group, each fed in its stream's order. A caller that already keeps each
resident block's latest store (the collector's chains) keeps the resident side itself: it says a store with
`came_back` and gives a loss's store times to `lost`, and the clock holds only what it was told of otherwise.

It is bounded: at most `max_blocks` resident blocks (the oldest stored forgotten first, a bound against a lost
stream) and at most `max_blocks` lost ones, none older than `horizon_s` once a trim is due. A loss of a block it does
not hold (stored before it started, or forgotten) has no lifetime (None), and its store back is no restore: only what
the stream showed is said; nor is a store of a block lost longer ago than the horizon.

Expired losses are dropped a stretch at a time (`TRIM_EVERY` of the horizon): finding a dict's oldest key walks past
every key deleted from its front since the dict last grew, so looking at it on each loss cost a time that grew with
the dict (a stream past its horizon spent hundreds of µs a loss). Until then an expired loss is held, never said.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice, repeat

MAX_BLOCKS = 2_000_000
HORIZON_S = 3600.0
# a bound's margin: this share of it more of the oldest dropped at once, as each drop walks past every key dropped from
# the dict's front since it last grew (`bench/block_registry.py --churn-bound`: a fixed margin walked far too often)
MARGIN = 1 / 100
TRIM_EVERY = 1 / 64  # of the horizon: how much stream time passes between two drops of expired losses


class BlockClock:
    __slots__ = ("max_blocks", "horizon_s", "stored_at", "lost_at", "_trim_at")

    def __init__(self, max_blocks: int = MAX_BLOCKS, horizon_s: float = HORIZON_S) -> None:
        self.max_blocks = max_blocks
        self.horizon_s = horizon_s
        # plain dicts, in insertion order (an OrderedDict's `update` loops in Python and holds a node per key)
        self.stored_at: dict[int, float] = {}  # resident block -> its latest store, first stored first
        self.lost_at: dict[int, float] = {}  # lost block -> when, oldest loss first
        self._trim_at = float("-inf")  # stream time from which the oldest loss may be past the horizon and a trim due

    def stored(self, hashes: list, ts: float) -> list[float | None] | None:
        """Each block's time since it was lost here (a restore), None where it was not lost within the horizon;
        None for the whole list when no block of it was (the common case: no list to make)."""
        gaps = self._restores(hashes, ts)
        stored_at = self.stored_at
        stored_at.update(dict.fromkeys(hashes, ts))
        self._bound(stored_at)
        return gaps

    def came_back(self, hashes: list, ts: float) -> list[float | None] | None:
        """`stored`, for a caller that keeps the blocks' store times itself: only the restores are said (and a store
        time this clock held for them, a rebuild's, is dropped)."""
        gaps, stored_at = self._restores(hashes, ts), self.stored_at
        if stored_at and not stored_at.keys().isdisjoint(hashes):
            for h in hashes:
                stored_at.pop(h, None)
        return gaps

    def _restores(self, hashes: list, ts: float) -> list[float | None] | None:
        lost_at = self.lost_at
        if not lost_at or lost_at.keys().isdisjoint(hashes):
            return None
        pop = lost_at.pop
        gaps = [None if (t := pop(h, None)) is None or ts - t > self.horizon_s else ts - t for h in hashes]
        return gaps if any(gap is not None for gap in gaps) else None

    def lost(self, hashes: Iterable, ts: float, stored: list[float | None] | None = None) -> list[float | None]:
        """Each block's lifetime: the time since its latest store here, None where that store is not known.
        `stored`: each block's latest store as its caller keeps it (None where it does not: this clock's)."""
        pop, lost_at = self.stored_at.pop, self.lost_at
        lifetimes: list[float | None] = []
        for h, t in zip(hashes, repeat(None) if stored is None else stored):
            if t is None:
                t = pop(h, None)
            if t is None:  # not known stored here: neither its lifetime nor, when it comes, a restore is shown
                lifetimes.append(None)
                continue
            lifetimes.append(ts - t)
            lost_at.pop(h, None)  # (a block lost again moves to the newest end)
            lost_at[h] = ts
        self._trim(ts)
        return lifetimes

    def cleared(self, ts: float, resident: Iterable = ()) -> None:
        """Every resident block lost at `ts` (a reset, a restarted engine); `resident`: those its caller keeps."""
        lost_at = self.lost_at
        for blocks in (self.stored_at, resident):
            for h in blocks:
                lost_at.pop(h, None)
            lost_at.update(dict.fromkeys(blocks, ts))
        self.stored_at.clear()
        self._trim(ts)

    def _trim(self, ts: float) -> None:
        lost_at = self.lost_at
        self._bound(lost_at)
        if ts < self._trim_at:
            return
        oldest, expired, first = ts - self.horizon_s, 0, ts
        for t in lost_at.values():
            if t >= oldest:
                first = t
                break
            expired += 1
        _drop_oldest(lost_at, expired)
        # (a loss after this one's is later still: the next trim is due once this one has expired, and a stretch more)
        self._trim_at = first + self.horizon_s * (1 + TRIM_EVERY)

    def _bound(self, entries: dict) -> None:
        if len(entries) > self.max_blocks:
            _drop_oldest(entries, overflow(len(entries), self.max_blocks))


def overflow(size: int, max_blocks: int) -> int:
    """How many of the oldest to drop from a dict past its bound: the excess, and a margin more (`MARGIN` of the
    bound) so that the next drop is a while away."""
    return size - max_blocks + int(max_blocks * MARGIN)


def _drop_oldest(entries: dict, n: int) -> None:
    for key in list(islice(entries, n)):
        del entries[key]
