"""Ownership by inference inside a stream's ingest: the stores of blocks that named no session kept a while, their
removals held until a session may be tied to them, and the adoption that moves such blocks to the session
`collectors.block_owners` tied them to (their footprint, their losses, their tool-pause losses)."""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Mapping
from typing import Protocol

import pandas as pd

from collectors.kv.batch_rows import REMOVED, BatchRows
from collectors.kv.chains import ChainTracker
from collectors.kv.core import Core
from collectors.kv.recent_stores import RecentStores
from collectors.kv.sequence_aliases import SequenceAliases
from collectors.kv.ties import tie_requests


class LossSpans(Protocol):
    """Where a stream's losses go as spans: the collector's `KVSpanBridge`, or a stream worker's `RemoteBridge`."""

    def on_batch(
        self, instance: str, ts: float, removed: Mapping[str | None, int], cleared: Mapping[str | None, int]
    ) -> None: ...


class Adoption:
    """`KVIngest`'s part that ownership by inference needs, on the ingest's own state (declared here, set by
    `KVIngest.__init__`)."""

    instance: str
    block_size: int | None
    chains: ChainTracker
    core: Core
    bridge: LossSpans | None
    lock: threading.Lock
    latest_ts: float
    recent: RecentStores | None
    hold_s: float
    aliases: SequenceAliases | None
    _held: deque[list]  # [arrived, ts, block (store's key), row fields, session, lost]
    _changed: set[str]
    _pending: deque[tuple[float, float, list[str], Counter]]

    def _seen(self, session: str, ts: float) -> None: ...

    def _flush(self, ts: float, rows: BatchRows) -> None: ...

    def infer_owners(self, hold_s: float, recent_s: float) -> None:
        """Keep the stores of blocks that name no session for `recent_s`, and hold their removals for `hold_s`:
        `collectors.block_owners` ties them to a session (`adopt`) once its step is joined."""
        self.recent, self.hold_s = RecentStores(recent_s), hold_s

    def adopt(self, owned: dict[tuple[str, int, float], str]) -> int:
        """(instance, block, when stored) -> session, for blocks that named none: resident ones, and removed ones
        still held, become the session's (its footprint, its losses, its tool-pause losses). Returns how many."""
        if self.recent is None:
            return 0
        with self.lock:
            return self._adopt(owned)

    def name_sequences(self) -> None:
        """Name this stream's blocks as Dynamo's router does, for its request-trace rows to find them
        (`collectors.dynamo_join`); its stores must come decoded with their token hashes."""
        self.aliases = SequenceAliases()

    def sequence_blocks(self, named: list[list[int]]) -> list[int]:
        """Of each trace row's named blocks, how many this stream holds."""
        if self.aliases is None:
            return [0] * len(named)
        with self.lock:
            return [len(self.aliases.blocks(hashes)) for hashes in named]

    def adopt_sequences(self, asks: list[tuple[str, list[int]]]) -> int:
        """(session, a trace row's named blocks), in the rows' order: the blocks held that named no session become
        the first of those sessions' to name them (resident ones, and removed ones still held). Returns how many."""
        if self.aliases is None or self.recent is None:
            return 0
        with self.lock:
            owned: dict[tuple[str, int, float], str] = {}
            for session, hashes in asks:
                for block in self.aliases.blocks(hashes):
                    owned.setdefault((self.instance, block, 0.0), session)
            return self._adopt(owned)

    def recent_stores(self, since: float = float("-inf")) -> pd.DataFrame:
        """The recent stores (from `since` on) of blocks that named no session, as `kvobs.analytics.cache.ownership`
        reads them."""
        if self.recent is None:
            raise RuntimeError("recent_stores before infer_owners")
        with self.lock:
            return self.recent.frame(self.instance, self.block_size, since)

    def tie(self, frame: pd.DataFrame, due_ids: list[str], since: float) -> tuple[list[str], pd.DataFrame, int]:
        """Ownership by inference's part that reads this stream's chains (`collectors.kv.ties.tie_requests`)."""
        return tie_requests(self, frame, due_ids, since)

    def _adopt(self, owned: dict[tuple[str, int, float], str]) -> int:
        adopted = 0
        held: dict[int, list[list]] = {}
        for item in self._held:
            held.setdefault(item[2], []).append(item)
        for (_, block_hash, _), session in owned.items():
            if self.chains.adopt(block_hash, session):
                self._move(session, resident=1, stored=1)
            else:
                waiting = [item for item in held.get(block_hash, ()) if item[4] is None]
                if not waiting:
                    continue
                waiting[0][4] = session
                self._move(session, stored=1, removed=int(waiting[0][5]))
            adopted += 1
            self._changed.add(session)
            self._seen(session, self.latest_ts)
        return adopted

    def _move(self, session: str, **counts: int) -> None:
        """Counts of a block that named no session, moved to the session it was tied to."""
        unknown, known = self.chains.footprint(None), self.chains.footprint(session)
        for name, n in counts.items():
            setattr(unknown, name, getattr(unknown, name) - n)
            setattr(known, name, getattr(known, name) + n)

    def _release(self, arrived_before: float) -> None:
        """Write the held removals that waited their time, with the session each was tied to (or none); a tied
        one's loss is then classified like any (in a tool pause or not), and its loss span names that session."""
        by_ts: dict[float, BatchRows] = {}
        while self._held and self._held[0][0] <= arrived_before:
            arrived, ts, block_hash, fields, session, lost = self._held.popleft()
            rows = by_ts.get(ts) or by_ts.setdefault(ts, self.core.new_rows())
            rows.add(REMOVED, block_hash=block_hash, session_id=session, first_owner=1, **fields)
            rows.losers.append(session)
            if session is not None and lost:  # (as arrived: it has waited longer than a removal settles)
                self._pending.append((arrived, ts, [session], Counter({session: 1})))
        for ts, rows in by_ts.items():
            self._flush(ts, rows)
            if self.bridge is not None and rows.losers:  # the loss span names the session the block was tied to
                self.bridge.on_batch(self.instance, ts, Counter(rows.losers), {})
