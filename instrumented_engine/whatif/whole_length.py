"""One cache replaying requests whole, from their lookup to their finish: how the what-if replays an engine that
publishes no allocations (vLLM), one cache (`whatif.replay.simulate`) or one replica of a fleet (`whatif.fleet`)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.observers.losses import LossTally
from instrumented_engine.whatif.engine_rules import AT_ALLOCATION, REGISTERS_WORDS, WHEN_COMPUTED
from instrumented_engine.whatif.tier import Loads, drop_stores, load_prefix, tally
from instrumented_engine.whatif.units import ReplayClock, ReplayRequest, WhatIfResult, replay_sequence


class WholeLengthCache:
    """One cache replaying requests whole (vLLM's data has no allocations): a request looks its prefix up when it
    arrives and takes blocks for its prompt; its decode takes a block each time its output fills one, at the time
    its recorded first token and finish put that token (evenly between them), and it holds them all until its
    recorded finish, when its decode's full blocks are cached. One that finds no room for its prompt waits (FCFS)
    until a finish frees enough; a decode block that finds none is taken at the next chance (a finish frees room).
    `decode_growth` False takes the whole length at admission (the replay before; kept to measure the difference).
    `registers` (`engine_rules.REGISTERS`): whether others find its prompt's blocks from its lookup or its first token.
    Counts into `result`; `last_request` (session -> its last request id) tells the session's end."""

    def __init__(
        self,
        manager: BlockManager,
        block_size: int,
        result: WhatIfResult,
        clock: ReplayClock,
        *,
        decode_growth: bool = True,
        registers: str = AT_ALLOCATION,
    ) -> None:
        if registers not in REGISTERS_WORDS:
            raise ValueError(f"registers must be one of {sorted(REGISTERS_WORDS)}; got {registers!r}")
        self.manager, self.block_size, self.result, self.clock = manager, block_size, result, clock
        self.decode_growth, self.registers = decode_growth, registers
        self.key = manager.hash_key(None)
        self.computed: set[bytes] = set()  # blocks computed at least once in this replay
        # what comes due: (time, order, sequence, the tokens its next decode block starts at; 0: its finish; below
        # 0: minus its prompt's tokens, computed now)
        self.due: list[tuple[float, int, Sequence, int]] = []
        self.short: dict[str, tuple[Sequence, int, int]] = {}  # decode blocks that found no room (`_grow`'s args)
        self.totals: dict[str, int] = {}  # request -> its whole length in tokens
        self.waiting: deque[tuple[ReplayRequest, Sequence, float]] = deque()
        self.order = itertools.count()
        self.last_request: dict[str | None, str] = {}
        self.active_blocks = 0  # blocks held by admitted requests (a router's decode load)
        self.wait_s = 0.0  # seconds requests waited for room
        self.loads: Loads = []  # (session, blocks loaded from the tier), not tallied yet

    def tally(self, losses: LossTally) -> None:
        tally(losses, self.manager, self.loads)

    def next_finish(self) -> float:
        """When the next thing comes due (a finish, or a decode block): inf when nothing is running."""
        return self.due[0][0] if self.due else float("inf")

    def arrive(self, req: ReplayRequest, seq: Sequence | None = None) -> None:
        """A request arrives now (as `seq` when the caller made it already): admitted, or waiting; turned away when
        it is longer than the whole cache."""
        if -(-req.total_tokens // self.block_size) > self.manager.num_usable_blocks:
            self.result.too_large += 1
            return
        seq = replay_sequence(req, self.key, self.block_size) if seq is None else seq
        self.result.requests += 1
        self.result.query_tokens += req.prompt_tokens
        self.manager.begin_request(seq)
        if self.waiting or not self._admit(req, seq):
            self.result.waited += 1
            self.waiting.append((req, seq, self.clock.now))

    def finish_one(self) -> None:
        """The next thing due: a decode block taken, or a finish (its decode's full blocks cached, its blocks
        freed, the session idle or ended after its last request, then whoever waits and now fits)."""
        self.clock.now, _, seq, at = heapq.heappop(self.due)
        if at < 0:
            self._computed(seq, -at)
            return
        if at:
            self._grow(seq, at, 1)
            return
        self._grow(seq, self.totals.pop(seq.request_id), 0)
        self.short.pop(seq.request_id, None)
        self.active_blocks -= len(seq.block_table)
        self.manager.free(seq)
        self.manager.end_request(seq)
        if seq.session_id is not None and self.last_request.get(seq.session_id) == seq.request_id:
            self.manager.end_session(seq.session_id)  # hindsight: the session never comes back
        for other in list(self.short.values()):  # room freed: the decode blocks that found none before
            self._grow(*other)
        while self.waiting and self._admit(*self.waiting[0][:2]):
            self.wait_s += self.clock.now - self.waiting.popleft()[2]

    def _grow(self, seq: Sequence, tokens: int, take: int) -> None:
        """`seq` has computed `tokens` tokens: its full blocks among them are cached, and with `take` (1) a block for
        its next token is taken; one that finds no room is tried again after the next finish."""
        self.short.pop(seq.request_id, None)
        self._computed(seq, min(tokens, len(seq.block_table) * self.block_size))
        if -(-(tokens + take) // self.block_size) > len(seq.block_table):
            held = len(seq.block_table)
            if not self.manager.allocate(seq, tokens + take - seq.num_computed_tokens):
                self.short[seq.request_id] = (seq, tokens, take)
                return
            self.active_blocks += len(seq.block_table) - held
            self._computed(seq, tokens)

    def _computed(self, seq: Sequence, tokens: int) -> None:
        if tokens > seq.num_computed_tokens:
            seq.token_ids.extend([0] * (tokens - len(seq.token_ids)))
            seq.num_computed_tokens = tokens
            self.manager.register_computed_blocks(seq)
            drop_stores(self.manager)

    def _admit(self, req: ReplayRequest, seq: Sequence) -> bool:
        manager, size = self.manager, self.block_size
        hits = manager.lookup(seq)
        upfront = req.prompt_tokens if self.decode_growth else req.total_tokens
        if not manager.allocate(seq, upfront - len(hits) * size, hits):
            return False
        loaded = load_prefix(manager, seq, len(hits), manager.tier_lookup(seq, len(hits)))
        if manager.tier is not None:
            self.loads.append((seq.session_id, loaded))
        found = len(hits) + len(loaded)
        self.result.hit_tokens += found * size
        self.result.request_hits[req.request_id] = found * size
        self.result.tier_hit_tokens += len(loaded) * size
        if loaded:
            self.result.request_loads[req.request_id] = len(loaded) * size
        missed = seq.block_hashes[found : (req.prompt_tokens - 1) // size]
        self.result.recompute_tokens += size * sum(1 for h in missed if h in self.computed)
        seq.token_ids.extend([0] * (upfront - req.prompt_tokens))
        computed_at = req.first_token_ts if self.registers == WHEN_COMPUTED else None
        if computed_at is not None and computed_at > self.clock.now:
            heapq.heappush(self.due, (computed_at, next(self.order), seq, -upfront))
        else:
            seq.num_computed_tokens = upfront
            manager.register_computed_blocks(seq)
            drop_stores(manager)
        self.computed.update(seq.block_hashes[: req.total_tokens // size])
        self.active_blocks += len(seq.block_table)
        self.totals[req.request_id] = req.total_tokens
        finish = max(req.finished_ts, self.clock.now)
        for tokens, when in self._decode_blocks(req, finish):
            heapq.heappush(self.due, (when, next(self.order), seq, tokens))
        heapq.heappush(self.due, (finish, next(self.order), seq, 0))
        return True

    def _decode_blocks(self, req: ReplayRequest, finish: float) -> list[tuple[int, float]]:
        """(tokens, when) of each block its decode takes after its prompt's: when its output reaches the block's first
        token, its output tokens spread evenly from its first token to its finish."""
        if not self.decode_growth:
            return []
        size, prompt, total = self.block_size, req.prompt_tokens, req.total_tokens
        first = max(self.clock.now, req.first_token_ts if req.first_token_ts is not None else self.clock.now)
        first = min(first, finish)
        outputs = total - prompt
        per = (finish - first) / max(outputs - 1, 1)
        starts = range(-(-prompt // size) * size, total, size)  # a block's first token, past the prompt's blocks
        return [(start, first + (start - prompt) * per) for start in starts]
