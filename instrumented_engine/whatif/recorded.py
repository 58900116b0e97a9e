"""Replay our engine's recorded KV traffic step for step: what-if at the observed size reproduces the run.

    traffic = RecordedTraffic.from_store(store, since, until, plan.requests)   # None for vLLM data
    replay_recorded(traffic, plan, manager, result, losses)

`kvobs serve` records, per request, when it looked its prefix up (`hit`, with a re-admission after a preemption),
when it took new blocks (`allocated`), which blocks it registered (`stored`), when it was preempted, when it
arrived and finished (`requests`), and when each session was released (`evicted` rows of reason
`session_release`). Replaying those in time order through the engine's own block manager makes its decisions
again: at the observed size and policy the same blocks are evicted, for the same reasons, and the same idle losses
are settled as tool pauses. At another size or policy the requests keep their recorded times; where an allocation
finds no room, the most recently admitted running request is preempted, as the engine's scheduler does.
vLLM publishes no allocations, so its data is replayed by `whatif.simulate`'s approximation instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.observers.losses import LossTally
from instrumented_engine.whatif.tier import Loads, drop_stores, load_prefix, tally
from kvobs.semconv.reasons import EvictionReason
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store

ARRIVE, EVENT, RELEASE, FINISH = 0, 1, 2, 3  # order of things recorded at the same time
KINDS = (KVEventKind.HIT.value, KVEventKind.ALLOCATED.value, KVEventKind.STORED.value, KVEventKind.PREEMPTED.value)


@dataclass(frozen=True)
class Action:
    ts: float
    order: int
    kind: str  # arrive, finish, release, or a kv_events kind
    request_id: str | None = None
    session_id: str | None = None
    num_tokens: int = 0
    block_hash: int | None = None


@dataclass
class RecordedTraffic:
    actions: list[Action]

    @classmethod
    def from_store(cls, store: Store, since, until, requests) -> RecordedTraffic | None:
        """The recorded traffic of `requests` (ReplayRequests), or None when the store has no allocations for them."""
        wanted = {r.request_id for r in requests}
        rows = store.reads.kv_events(since, until, kinds=KINDS)
        rows = rows[rows["request_id"].isin(wanted)]
        if not (rows["kind"] == KVEventKind.ALLOCATED.value).any():
            return None
        actions = [
            Action(
                r.received_ts if r.received_ts is not None else r.arrival_ts,
                ARRIVE,
                "arrive",
                r.request_id,
                r.session_id,
            )
            for r in requests
        ]
        actions += [Action(r.finished_ts, FINISH, "finish", r.request_id, r.session_id) for r in requests]
        for row in rows.itertuples(index=False):  # kv_events come in (ts, id) order: the engine's own
            tokens = 0 if pd.isna(row.num_tokens) else int(row.num_tokens)
            block = None if row.block_hash is None or pd.isna(row.block_hash) else int(row.block_hash)
            actions.append(Action(row.ts, EVENT, row.kind, row.request_id, row.session_id, tokens, block))
        actions += [Action(ts, RELEASE, "release", None, sid) for sid, ts in releases(store, since, until).items()]
        actions.sort(key=lambda a: (a.ts, a.order))  # stable: events keep their recorded order
        return cls(actions)


def releases(store: Store, since, until, instances=None) -> dict[str, float]:
    """When each session was released on `instances` (None: any): its first `session_release` loss, an eviction
    our engine wrote or a removal a collector took from its stream, whose `BlockRemoved` says the reason."""
    kinds = [KVEventKind.EVICTED.value, KVEventKind.REMOVED.value]
    losses = store.reads.kv_events(since, until, kinds=kinds)
    released = losses[losses["reason"] == EvictionReason.SESSION_RELEASE.value]
    if instances is not None:
        released = released[released["instance"].isin(list(instances))]
    return released.groupby("session_id")["ts"].min().to_dict()


class RecordedReplay:
    """The replay's state: sequences by request, running ones in admission order."""

    def __init__(self, manager: BlockManager, sequences: dict[str, Sequence], result) -> None:
        self.bm = manager
        self.block_size = manager.block_size
        self.seqs = sequences
        self.result = result
        self.running: list[str] = []
        self.admitted: set[str] = set()
        self.computed: set[bytes] = set()  # block hashes registered at least once in this replay
        self.loads: Loads = []  # (session, blocks loaded from the tier), not tallied yet

    def tally(self, losses: LossTally) -> None:
        tally(losses, self.bm, self.loads)

    def apply(self, action: Action) -> None:
        seq = self.seqs.get(action.request_id) if action.request_id is not None else None
        if action.kind == "release":
            if action.session_id is not None:  # (a release names its session)
                self.bm.release_session(action.session_id)
        elif seq is None:
            return
        elif action.kind == "arrive":
            self.bm.begin_request(seq)
        elif action.kind == "finish":
            self._free(seq)
            self.bm.end_request(seq)
        elif action.kind == KVEventKind.PREEMPTED.value:
            self._free(seq)
            seq.token_ids = [0] * (action.num_tokens + 1)  # the computed tokens it lost and its sampled token
        elif action.kind == KVEventKind.STORED.value:
            self._register(seq, action.block_hash)
        elif seq.request_id not in self.running:  # a hit or an allocation of a waiting request: its admission
            self._admit(seq, action.num_tokens // self.block_size if action.kind == KVEventKind.ALLOCATED.value else 0)
        elif action.kind == KVEventKind.ALLOCATED.value:  # a running request grows
            seq.num_computed_tokens = len(seq.block_table) * self.block_size
            self._allocate(seq, action.num_tokens // self.block_size, [])

    def _admit(self, seq: Sequence, num_new: int) -> None:
        hits = self.bm.lookup(seq)
        num_loaded = self.bm.tier_lookup(seq, len(hits))
        seq.num_computed_tokens = 0
        if self._allocate(seq, max(num_new, num_loaded), hits):  # (the engine's allocation held what it loaded)
            seq.num_registered_blocks = len(hits)
            self.running.append(seq.request_id)
            loaded = load_prefix(self.bm, seq, len(hits), num_loaded)
            found = len(hits) + len(loaded)
            if loaded:  # their KV is there now: cached again, as the engine caches a loaded block
                seq.num_computed_tokens = found * self.block_size
                self.bm.register_computed_blocks(seq)
                drop_stores(self.bm)
            if seq.request_id not in self.admitted:  # a first admission counts its hits (re-admissions do not)
                self.admitted.add(seq.request_id)
                if self.bm.tier is not None:
                    self.loads.append((seq.session_id, loaded))
                self.result.hit_tokens += found * self.block_size
                self.result.request_hits[seq.request_id] = found * self.block_size
                self.result.tier_hit_tokens += len(loaded) * self.block_size
                if loaded:
                    self.result.request_loads[seq.request_id] = len(loaded) * self.block_size
                missed = seq.block_hashes[found : (seq.num_tokens - 1) // self.block_size]
                self.result.recompute_tokens += self.block_size * sum(1 for h in missed if h in self.computed)

    def _allocate(self, seq: Sequence, num_blocks: int, hits: list) -> bool:
        while not self.bm.allocate(seq, num_blocks * self.block_size, hits):
            victims = [rid for rid in self.running if rid != seq.request_id]
            if not victims:
                self.result.waited += 1
                return False
            self._free(self.seqs[victims[-1]])  # the engine preempts the most recently admitted one
            self.result.preemptions += 1
        return True

    def _register(self, seq: Sequence, block_hash: int | None) -> None:
        key = None if block_hash is None else block_hash.to_bytes(8, "big")
        position = seq.block_hashes.index(key) if key in seq.block_hashes else -1
        if position < 0 or position >= len(seq.block_table):
            return  # this replay preempted it earlier than the engine did: the block is not there to register
        seq.num_computed_tokens = max(seq.num_computed_tokens, (position + 1) * self.block_size)
        seq.token_ids.extend([0] * max(0, seq.num_computed_tokens - len(seq.token_ids)))
        self.bm.register_computed_blocks(seq)
        drop_stores(self.bm)
        self.computed.update(seq.block_hashes[: position + 1])

    def _free(self, seq: Sequence) -> None:
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        if seq.request_id in self.running:
            self.running.remove(seq.request_id)
