"""The what-if's offload tier: a request's prefix goes on in the tier past the primary cache's hits, and those
blocks are loaded, as the engine's scheduler does (`BlockManager.tier_lookup`, `load_from_tier`); a replay copies
no KV, so the copies the block manager plans are dropped once counted.

    n = manager.tier_lookup(seq, len(hits))         # before the allocation, which must hold them too
    loaded = load_prefix(manager, seq, len(hits), n)  # after it: the hashes of the blocks loaded
    drop_stores(manager)                            # after a registration: the tier's stores need no copy
    tally(losses, manager, loads)                   # events, then [(session, loaded)], into a LossTally
"""

from __future__ import annotations

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.observers.losses import LossTally

Loads = list[tuple[str | None, tuple[int, ...]]]  # (session, blocks its request loaded from the tier), in order


def load_prefix(manager: BlockManager, seq: Sequence, num_hits: int, num_loaded: int) -> tuple[int, ...]:
    """After `seq`'s allocation: the `num_loaded` blocks past the cache's `num_hits` that the tier holds
    (`tier_lookup`), loaded; their hashes as published (() without a tier)."""
    if manager.tier is None:
        return ()
    manager.load_from_tier(seq, num_hits, num_loaded)
    loaded = tuple(h for copy in manager.tier_loads for h in copy.block_hashes)
    manager.tier_loads.clear()
    return loaded


def drop_stores(manager: BlockManager) -> None:
    """The tier's stores are made (its bookkeeping); the copies the engine would make are not needed."""
    manager.tier_stores.clear()


def tally(losses: LossTally, manager: BlockManager, loads: Loads) -> None:
    """The block manager's events since the last tally into `losses`, then the tier loads made meanwhile (a request
    loads after its arrival settled its session's pause); `loads` is emptied."""
    losses.add(manager.take_events())
    for session, loaded in loads:
        losses.loaded(session, loaded)
    loads.clear()
