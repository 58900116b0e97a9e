"""Which replica holds which block, rebuilt from the fleet's KV events in one pass in time order (`FleetIndex`): what
a request's lookup is compared against (`kvobs.analytics.cache.routing`), by the range replay and the collector's meter.

    index = FleetIndex(track_losses=True)
    index.apply(kinds, instances, hashes, parents, times, media)   # KV events of `routing.ROUTING_KINDS`, in order
    index.prefix_on("vllm-b", chain)                               # leading blocks of a chain vllm-b holds
"""

from __future__ import annotations

import itertools
from collections import Counter

import pandas as pd

from kvobs.semconv.attributes import is_lower_tier, is_shared_tier
from kvobs.semconv.spans import KVEventKind

STORED = KVEventKind.STORED.value
CLEARED = KVEventKind.CLEARED.value
# a copy reaching a tier, the cache's own or one below it; a copy leaving one (the block's last copy: its loss)
STORE_KINDS = frozenset({STORED, KVEventKind.TIER_STORED.value})
LOSS_KINDS = frozenset(
    {
        KVEventKind.REMOVED.value,
        KVEventKind.EVICTED.value,
        KVEventKind.INVALIDATED.value,
        KVEventKind.TIER_REMOVED.value,
    }
)


class FleetIndex:
    """Which replica holds which block, advanced through KV events in time order (one pass): each instance's
    resident block hashes, and the parent of every block some replica holds (what a request's chain is walked
    through). A block no replica holds any more is forgotten, so the index is as large as the fleet's caches.

    A replica holds a block while any of its tiers does (`medium`: the device cache, an offload tier), since a block
    on an offload tier is loaded, not recomputed (llm-d's scorer counts it too, at a lower weight): an offload
    tier's copy dropped, or the device copy evicted after it reached the offload tier, is no loss of the block.
    A shared tier's copies (`is_shared_tier`: one the replica named REMOTE, a shared storage or pool) are no replica's:
    a request sent elsewhere may load them too, so they neither make a replica hold a block nor lose it (as Dynamo's
    router leaves a REMOTE tier's events out)."""

    def __init__(self, *, track_losses: bool = False) -> None:
        self.resident: dict[str, dict[int, int]] = {}  # instance -> block -> how many of its tiers hold it
        self._tiers: dict[str, dict[str | None, set[int]]] = {}  # instance -> medium -> the blocks that tier holds
        self.parent: dict[int, int | None] = {}
        self._holders: Counter[int] = Counter()
        # with `track_losses`: (instance, block) -> (when, kind) of its loss there, until it is stored there again;
        # and block -> when some replica first and last stored it (a block never stored before a lookup is cold)
        self.lost: dict[tuple[str, int], tuple[float, str]] | None = {} if track_losses else None
        self.first_stored: dict[int, float] = {}
        self.last_stored: dict[int, float] = {}
        # with `track_losses`: block -> the replica that first stored it (as long as `first_stored`), so that a store
        # of it elsewhere after that replica dropped it still shows their hashes meet (`meets`)
        self._first_at: dict[int, str] = {}

    def apply(self, kinds, instances, hashes, parents, times=None, media=None) -> None:
        """Apply events (columns, in time order) of `ROUTING_KINDS`; `times` (their `ts`) when losses are tracked;
        `media` (their tier, None where not named; all None: one tier)."""
        lost, tiers, resident, holders = self.lost, self._tiers, self.resident, self._holders
        times = itertools.repeat(0.0) if times is None else times
        media = itertools.repeat(None) if media is None else media
        for kind, instance, block_hash, parent, ts, medium in zip(kinds, instances, hashes, parents, times, media):
            if type(medium) is str and is_shared_tier(medium):  # (a column's missing medium: None or NaN)
                continue  # (a copy other replicas may read too: the replica's own, or no loss, is not known)
            if kind in STORE_KINDS:
                block_hash = int(block_hash)
                by_tier = tiers.get(instance)
                if by_tier is None:
                    by_tier = tiers[instance] = {}
                    resident[instance] = {}
                copies = by_tier.get(medium)
                if copies is None:
                    copies = by_tier[medium] = set()
                if block_hash not in copies:
                    copies.add(block_hash)
                    held = resident[instance]
                    count = held.get(block_hash, 0)
                    if not count:
                        holders[block_hash] += 1
                    held[block_hash] = count + 1
                self.parent[block_hash] = None if pd.isna(parent) else int(parent)
                if lost is not None:
                    lost.pop((instance, block_hash), None)
                    self._first_at.setdefault(block_hash, instance)
                    self.first_stored.setdefault(block_hash, ts)
                    self.last_stored[block_hash] = ts
            elif kind == CLEARED:  # a reset drops every tier's blocks
                tiers.pop(instance, None)
                for block_hash in resident.pop(instance, ()):
                    self._release(block_hash)
                    if lost is not None:
                        lost[(instance, block_hash)] = (ts, kind)
            elif kind in LOSS_KINDS and not pd.isna(block_hash):
                by_tier, block_hash = tiers.get(instance), int(block_hash)
                if by_tier is None:
                    continue
                copies = by_tier.get(medium)
                if (copies is None or block_hash not in copies) and medium is None:
                    copies = next((c for c in by_tier.values() if block_hash in c), None)  # where it is
                if copies is None or block_hash not in copies:
                    continue
                copies.discard(block_hash)
                held = resident[instance]
                count = held[block_hash] - 1
                if count:
                    held[block_hash] = count
                    continue
                del held[block_hash]  # its last copy on this replica
                self._release(block_hash)
                if lost is not None:
                    lost[(instance, block_hash)] = (ts, kind)

    def forget_losses(self, before_ts: float) -> None:
        """Forget the losses tracked from before `before_ts`, and the blocks no replica stored since (a long-lived
        index would remember every block lost and never stored again): a block missed later counts as evicted
        for room (`capacity`), or as `cold` if no replica stored it since, as a replay reading back as far finds."""
        if self.lost:
            self.lost = {key: loss for key, loss in self.lost.items() if loss[0] >= before_ts}
        gone = [block_hash for block_hash, ts in self.last_stored.items() if ts < before_ts]
        for block_hash in gone:
            del self.last_stored[block_hash], self.first_stored[block_hash]
            self._first_at.pop(block_hash, None)

    def meets(self, stored: dict[str, set[int]]) -> set[frozenset[str]]:
        """Pairs of replicas whose block hashes these stores (instance -> blocks, before they are applied) show to
        meet: a block one stores that another holds, stores alike, or first stored (`routing.FleetCheck`'s `met`)."""
        met: set[frozenset[str]] = set()
        for a, blocks in stored.items():
            met.update(frozenset((a, b)) for b, held in self.resident.items() if b != a and not blocks.isdisjoint(held))
            met.update(frozenset((a, b)) for b, other in stored.items() if a < b and not blocks.isdisjoint(other))
            firsts = {self._first_at.get(block) for block in blocks}
            met.update(frozenset((a, b)) for b in firsts if b is not None and b != a)
        return met

    def _release(self, block_hash: int) -> None:
        self._holders[block_hash] -= 1
        if self._holders[block_hash] <= 0:
            del self._holders[block_hash]
            self.parent.pop(block_hash, None)

    def held_below_only(self, instance: str, blocks) -> int:
        """How many of `blocks` (held by `instance`) it holds only in tiers below its device cache (a hit there is
        a load); 0 at once on a replica with no tier below its cache."""
        by_tier = self._tiers.get(instance)
        if not by_tier or not any(is_lower_tier(medium) for medium in by_tier):
            return 0
        held = self.resident.get(instance, {})
        cache = [copies for medium, copies in by_tier.items() if not is_lower_tier(medium)]
        return sum(block_hash in held and not any(block_hash in c for c in cache) for block_hash in blocks)

    def prefix_on(self, instance: str, chain: list[int]) -> int:
        """How many of `chain`'s leading blocks `instance` holds, consecutively."""
        held = self.resident.get(instance, ())
        n = 0
        for block_hash in chain:
            if block_hash not in held:
                break
            n += 1
        return n
