"""The offload tier: vLLM's CPU offloading manager (`--kv-offloading-size`, LRU) below the primary cache.

    tier = OffloadTier(num_blocks=256)
    n = tier.lookup(hashes)                        # consecutive blocks held from the first; refreshes them (LRU)
    stored, evicted = tier.store(hashes, session)  # write-through: the new ones get slots, LRU room made
    tier.slot_of(block_hash)                       # where a held block's KV is

What vLLM's offloading connector does, without its transfers: every full block a request computes is stored
(write-through, as the connector stores each scheduled step's new full blocks), blocks already held are not stored
again, and room is made by evicting the least recently used (a lookup or a store refreshes a block). A prefix
lookup continues in the tier after the primary cache's hits, block by block, and stops at the first miss. It holds
no tensors (the model runner copies the KV), so the what-if can replay it. Blocks are keyed by their hash as
published (the low 64 bits), as an invalidation names them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from kvobs.semconv.attributes import MEDIUM_CPU


@dataclass
class TierBlock:
    """A block's copy in the tier: its slot in host memory and the sessions that stored it (its recency is its place
    in `OffloadTier.entries`)."""

    slot: int
    sessions: set[str] = field(default_factory=set)


@dataclass
class TierCopy:
    """KV of one request's blocks to copy between the primary cache and the tier (the model runner does it): block
    `block_ids[i]` of the primary cache and slot `slots[i]` of the tier; the blocks' hashes as published, their
    chain and tokens (for a store's event)."""

    request_id: str
    session_id: str | None
    block_ids: list[int]
    slots: list[int]
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    adapter: str | None = None


class OffloadTier:
    """A tier of `num_blocks` blocks (vLLM's `cpu_bytes_to_use // bytes per block`), evicting LRU.

    Args:
        num_blocks: blocks the tier holds (at least 1).
        medium: the tier's name in events, vLLM's (`CPU`).
    """

    def __init__(self, num_blocks: int, *, medium: str = MEDIUM_CPU) -> None:
        if num_blocks < 1:
            raise ValueError(f"an offload tier holds at least 1 block; got {num_blocks}")
        self.num_blocks = num_blocks
        self.medium = medium
        self.entries: OrderedDict[int, TierBlock] = OrderedDict()  # least recently used first
        self._free_slots = list(range(num_blocks - 1, -1, -1))
        self.num_store_failures = 0  # stores refused: more new blocks at once than the tier holds

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.entries

    def slot_of(self, block_hash: int) -> int:
        return self.entries[block_hash].slot

    def lookup(self, hashes: Iterable[int]) -> int:
        """How many of `hashes`, from the first, the tier holds (stopping at the first miss, reading no further);
        those are refreshed."""
        num = 0
        for block_hash in hashes:
            if block_hash not in self.entries:
                break
            self.entries.move_to_end(block_hash)
            num += 1
        return num

    def held(self, hashes: Iterable[int]) -> int:
        """`lookup` without its refresh: how many of `hashes`, from the first, the tier holds (a router looking at
        every replica's tiers changes none)."""
        num = 0
        for block_hash in hashes:
            if block_hash not in self.entries:
                break
            num += 1
        return num

    def store(
        self, hashes: Sequence[int], session_id: str | None
    ) -> tuple[list[tuple[int, int]], list[tuple[int, TierBlock]]] | None:
        """Store the blocks not held yet (those held are refreshed and gain the owner): ((hash, slot) stored,
        (hash, copy) evicted for room, least recently used first). None, storing nothing, when the new blocks
        outnumber the tier (vLLM's connector then skips the store and warns)."""
        new: list[int] = []
        for block_hash in hashes:
            held = self.entries.get(block_hash)
            if held is None:
                new.append(block_hash)
                continue
            if session_id is not None:
                held.sessions.add(session_id)
            self.entries.move_to_end(block_hash)
        if not new:
            return [], []
        if len(new) > self.num_blocks:
            self.num_store_failures += 1
            return None
        evicted: list[tuple[int, TierBlock]] = []
        while len(self._free_slots) < len(new):
            victim, copy = self.entries.popitem(last=False)
            self._free_slots.append(copy.slot)
            evicted.append((victim, copy))
        stored: list[tuple[int, int]] = []
        for block_hash in new:
            slot = self._free_slots.pop()
            self.entries[block_hash] = TierBlock(slot, {session_id} if session_id is not None else set())
            stored.append((block_hash, slot))
        return stored, evicted

    def drop(self, hashes: Collection[int] = (), sessions: Collection[str] = ()) -> list[tuple[int, TierBlock]]:
        """Drop the copies of `hashes` and those `sessions` stored (an invalidation of them); what was dropped."""
        sessions = set(sessions)
        victims = [h for h, copy in self.entries.items() if h in hashes or (sessions and copy.sessions & sessions)]
        dropped = [(h, self.entries.pop(h)) for h in victims]
        self._free_slots.extend(copy.slot for _, copy in dropped)
        return dropped

    def clear(self) -> int:
        """Drop every copy (a prefix-cache reset: vLLM resets its connector's cache with it); how many."""
        num = len(self.entries)
        self.entries.clear()
        self._free_slots = list(range(self.num_blocks - 1, -1, -1))
        return num
