"""Who owns a cached block: hash chains rebuilt from vLLM's `BlockStored` / `BlockRemoved` / `AllBlocksCleared`.

    chains = ChainTracker()
    chains.stored([h1, h2], parent=None, session="s1", ts=10.0)  # s1 introduced h1 <- h2 at 10.0
    chains.removed(h2)                                            # (h1, ("s1",), 10.0): parent, owners, latest store
    chains.cleared(30.0)                                          # {"s1": 1}: every resident chain ends

A block is owned by the session(s) whose `BlockStored` introduced it (vLLM stores a block once; a session
that later hits it emits nothing). A removed hash that was stored before we subscribed has no known owner.
Per-session footprints count blocks resident now, stored, and lost (removed or cleared).

Each tracked block also keeps the time of its latest store: the chains are the tier's `BlockClock`'s resident side (a
loss row's `lifetime_s`), so millions of blocks are not keyed in a second dict; the clock keeps their losses (a
restore) and, after a restart's rebuild, the stores of blocks only the history showed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice

from kvobs.block_clock import BlockClock, overflow

# A tracked block is a plain tuple `(parent, owners, stored_at)` (a tuple display is several times cheaper to make
# than a NamedTuple or a dataclass), or, for a store of three blocks or more, the store's `Segment`, one tuple shared
# by its blocks: millions are tracked, and a tuple a block cost more memory than its key. `block_of` reads either.
Block = tuple  # (parent: int | bytes | None, owners: tuple[str | None, ...], stored_at: float (its latest store))
Segment = tuple  # (parent of its first block, owners, stored_at, *its blocks' hashes in chain order): one flat tuple
PARENT, OWNERS, STORED_AT, FIRST = 0, 1, 2, 3
SEGMENT_MIN = 3  # blocks a store needs to share one segment (below, a segment is no smaller than a tuple a block)


def block_of(block_hash, tracked: Block | Segment) -> Block:
    """A tracked block's `(parent, owners, stored_at)`, from its own tuple or from its store's segment."""
    if len(tracked) == FIRST:
        return tracked
    i = tracked.index(block_hash, FIRST)
    return (tracked[PARENT] if i == FIRST else tracked[i - 1], tracked[OWNERS], tracked[STORED_AT])


@dataclass(slots=True)  # (one a session, millions of sessions over a collector's life)
class Footprint:
    resident: int = 0
    stored: int = 0
    removed: int = 0
    removed_idle: int = 0  # in a tool pause (settled)
    cleared: int = 0


class ChainTracker:
    """Args:
    max_blocks: resident hashes remembered at most (past it the oldest are forgotten, and a margin more; a bound
        against a lost stream).
    clock: when its blocks were stored and lost (`kvobs.block_clock`), which its caller feeds; a new one by default.
    """

    def __init__(self, max_blocks: int = 2_000_000, clock: BlockClock | None = None) -> None:
        self.max_blocks = max_blocks
        self.clock = BlockClock() if clock is None else clock
        # a plain dict, in insertion order (an OrderedDict holds a linked-list node per key as well)
        self.blocks: dict[int | bytes, Block | Segment] = {}
        self.footprints: dict[str | None, Footprint] = {}
        self.num_unknown_removed = 0  # removals of blocks not resident (stored before we subscribed, or twice)
        self.num_repeated = 0  # stores of blocks already resident (an announcement again)

    def stored(self, hashes: list, parent, session: str | None, ts: float) -> list[int] | None:
        """Track the blocks, stored at `ts`; returns None when every one was new to the tier, else a flag a block
        (1: new, 0: already resident: announced again, as an offload tier may, and counted once; its latest store is
        then `ts`)."""
        blocks, owner, firsts = self.blocks, (session,), None
        if blocks.keys().isdisjoint(hashes):  # every block new (the common case): no flag to keep
            new = len(hashes)
            if new >= SEGMENT_MIN:
                blocks.update(dict.fromkeys(hashes, (parent, owner, ts, *hashes)))
            else:
                for block_hash in hashes:
                    blocks[block_hash] = (parent, owner, ts)
                    parent = block_hash
        else:
            firsts, new = [], 0
            for block_hash in hashes:
                block = blocks.get(block_hash)
                firsts.append(1 if block is None else 0)
                if block is None:
                    blocks[block_hash] = (parent, owner, ts)
                    new += 1
                else:
                    self.num_repeated += 1
                    owners = block[OWNERS]
                    known = session in owners
                    blocks[block_hash] = (
                        block_of(block_hash, block)[PARENT],
                        owners if known else (*owners, session),
                        ts,
                    )
                    new += not known  # (a new owner's: it counts in that session's footprint)
                parent = block_hash
        footprint = self.footprints.get(session) or self.footprint(session)  # (the call only for a new session)
        footprint.resident += new
        footprint.stored += new
        if len(blocks) > self.max_blocks:
            self._forget(overflow(len(blocks), self.max_blocks))
        return firsts

    def _forget(self, n: int) -> None:
        """Forget the `n` blocks stored first (no loss: they leave their footprints' resident count only)."""
        blocks = self.blocks
        for block_hash in list(islice(blocks, n)):
            for owner in blocks.pop(block_hash)[OWNERS]:
                self.footprint(owner).resident -= 1

    def removed(self, block_hash, lost: bool = True) -> Block | None:
        """The removed block's `(parent, owners, stored_at)`; None when it was stored before we subscribed. `lost`
        False: its session released it (no loss: it leaves the footprint uncounted)."""
        tracked = self.blocks.pop(block_hash, None)
        if tracked is None:
            self.num_unknown_removed += 1
            return None
        footprints = self.footprints
        for owner in tracked[OWNERS]:
            footprint = footprints.get(owner) or self.footprint(owner)
            footprint.resident -= 1
            footprint.removed += lost
        return block_of(block_hash, tracked)

    def store(self, hashes: list, parent, session: str | None, ts: float) -> tuple[list[int] | None, list | None]:
        """`stored`, and its clock's restores (`BlockClock.came_back`): what a store's rows are written from."""
        return self.stored(hashes, parent, session, ts), self.clock.came_back(hashes, ts)

    def remove(self, hashes: list, lost: bool, ts: float) -> tuple[list[Block | None], list[float | None]]:
        """`removed` for each block, and each one's lifetime (`BlockClock.lost`): what a removal's rows are
        written from."""
        removed = self.removed
        blocks = [removed(block_hash, lost) for block_hash in hashes]
        return blocks, self.clock.lost(hashes, ts, [None if block is None else block[STORED_AT] for block in blocks])

    def store_rows(self, rows, event, ts: float, row_kind: str, shared_start: int) -> None:
        """`store` of a `Stored` event, its rows written into `rows` (`BatchRows.stored`)."""
        firsts, gaps = self.store(event.hashes, event.parent, event.session_id, ts)
        rows.stored(event, firsts, row_kind, gaps, shared_start)

    def remove_rows(
        self, rows, hashes: list, lost: bool, ts: float, medium, num_tokens, group_idx, reason, row_kind, device: bool
    ) -> None:
        """`remove` of a removal's blocks, a row each and owner written into `rows` (`BatchRows.removed`; a block
        not resident: one row with no session); `device`: each row's owner is also a loser of the batch's."""
        out, parents, sessions, firsts, lives = removal_rows(hashes, *self.remove(hashes, lost, ts))
        if not out:
            return
        rows.removed(
            out,
            parents,
            sessions,
            firsts,
            lives,
            medium=medium,
            num_tokens=num_tokens,
            group_idx=group_idx,
            reason=reason,
            row_kind=row_kind,
        )
        if device:
            rows.losers += sessions

    def resident(self) -> int:
        """Blocks resident now, each once."""
        return len(self.blocks)

    def hashes(self) -> list:
        """The resident blocks' hashes, first stored first."""
        return list(self.blocks)

    def parents(self) -> Mapping:
        """The resident blocks' parents, looked up (never copied)."""
        return ResidentParents(self.blocks)

    def block(self, block_hash) -> Block | None:
        """A resident block's `(parent, owners, stored_at)`; None when it is not tracked."""
        tracked = self.blocks.get(block_hash)
        return None if tracked is None else block_of(block_hash, tracked)

    def adopt(self, block_hash, session: str) -> bool:
        """A resident block that named no owner becomes `session`'s (its caller moves the footprints' counts); False
        when the block is not resident or has an owner."""
        tracked = self.blocks.get(block_hash)
        if tracked is None or tracked[OWNERS] != (None,):
            return False
        parent, _, stored_at = block_of(block_hash, tracked)
        self.blocks[block_hash] = (parent, (session,), stored_at)
        return True

    def cleared(self, ts: float) -> dict[str | None, int]:
        """End every resident chain at `ts` (its clock says each block lost then); returns the blocks each session
        lost."""
        self.clock.cleared(ts, self.blocks)
        lost: dict[str | None, int] = {}
        for block in self.blocks.values():
            for owner in block[OWNERS]:
                lost[owner] = lost.get(owner, 0) + 1
        self.blocks.clear()
        for owner, n in lost.items():
            footprint = self.footprint(owner)
            footprint.resident -= n
            footprint.cleared += n
        return lost

    def footprint(self, session: str | None) -> Footprint:
        footprint = self.footprints.get(session)
        if footprint is None:
            footprint = self.footprints[session] = Footprint()
        return footprint


def removal_rows(hashes: list, blocks: list, lifetimes: list, held: Callable | None = None) -> tuple[list, ...]:
    """A removal's row columns (`BatchRows.removed`'s hashes, parents, sessions, firsts, lifetimes): a row each block
    and owner (a block not resident: one row with no session); `held(block_hash, block, lifetime)` True: that
    block's row is left out (its caller keeps it)."""
    out: list[int] = []
    parents: list = []
    sessions: list = []
    firsts: list[int] = []
    lives: list = []
    for block_hash, block, lifetime in zip(hashes, blocks, lifetimes):
        parent, owners = (None, (None,)) if block is None else block[:2]
        if held is not None and block is not None and held(block_hash, block, lifetime):
            continue
        n = len(owners)
        out += [block_hash] * n
        parents += [parent] * n
        sessions += owners
        firsts += [1] if n == 1 else [1] + [0] * (n - 1)
        lives += [lifetime] * n
    return out, parents, sessions, firsts, lives


class ResidentParents(Mapping):
    """The parents of a tracker's resident blocks, keyed as the store keys hashes: where a chain older than the
    recent stores is read from (its root, the shared system prompt, was stored long before)."""

    def __init__(self, blocks: dict) -> None:
        self.blocks = blocks

    def __getitem__(self, key):
        return block_of(key, self.blocks[key])[PARENT]

    def __contains__(self, key) -> bool:
        return key in self.blocks

    def __iter__(self):
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)
