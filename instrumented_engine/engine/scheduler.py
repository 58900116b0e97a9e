"""Continuous batching: FCFS admission under a per-step token budget, chunked prefill, decode,
and preemption by recompute.

Each step first serves running sequences in admission order (a decode is 1 token, an unfinished
prefill takes up to the remaining budget), then admits waiting sequences while the budget and
`max_num_seqs` allow. When a running sequence cannot get a block, the most recently admitted
running sequence is preempted (its blocks freed, still cached) and put back at the front of the
waiting queue; it looks its prefix up again on re-admission. No admission happens in a step that
preempted, as in vLLM.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledSeq:
    """`num_new_tokens` of `seq` from position `start`, fixed when scheduled.

    `samples` is True when the chunk reaches the sequence's last token, so the step samples one.
    """

    seq: Sequence
    num_new_tokens: int
    start: int
    samples: bool

    @classmethod
    def of(cls, seq: Sequence, num_new_tokens: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return cls(seq, num_new_tokens, start, start + num_new_tokens == seq.num_tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    started: list[Sequence] = field(default_factory=list)  # admitted for the first time (not re-admissions)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        clock: Callable[[], float],
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._events: list[ev.KVEvent] = []
        self.num_preemptions_total = 0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        self.bm.begin_request(seq)

    def take_events(self) -> list[ev.KVEvent]:
        """Block-manager and scheduler events of the last step, in the order they happened."""
        events = self.bm.take_events()
        if self._events:
            events = sorted(events + self._events, key=lambda e: e.ts)
            self._events = []
        return events

    # ---- scheduling -----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        self.bm.expire_idle_sessions()
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.bm.allocate(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSeq.of(seq, num_new))
                budget -= num_new
                i += 1
        if not out.preempted:
            self._admit(out, budget)
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.bm.lookup(seq)
            num_loaded = self.bm.tier_lookup(seq, len(hits))  # the prefix goes on in the offload tier
            hit_tokens = (len(hits) + num_loaded) * self.bm.block_size
            num_new = seq.num_tokens - hit_tokens
            if num_new > budget:
                if not self.enable_chunked_prefill:
                    break
                num_new = budget
            now = self.clock()
            reuse_gaps = tuple(now - b.last_used_ts for b in hits)  # before allocate touches them
            if not self.bm.allocate(seq, num_new + num_loaded * self.bm.block_size, hits):
                break
            self.bm.load_from_tier(seq, len(hits), num_loaded)
            self.waiting.popleft()
            seq.num_computed_tokens = hit_tokens
            seq.status = SequenceStatus.RUNNING
            if self._record_admission(seq, len(hits), reuse_gaps, now, num_loaded):
                out.started.append(seq)
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq.of(seq, num_new))
            budget -= num_new

    def _record_admission(
        self, seq: Sequence, num_hits: int, reuse_gaps: tuple[float, ...], now: float, num_loaded: int = 0
    ) -> bool:
        """Record the lookup (and a resumption); True when this is the sequence's first admission. Its cached tokens
        count those loaded from the offload tier, as vLLM counts its connector's."""
        readmission = seq.num_cached_tokens is not None
        hit_tokens, loaded_tokens = num_hits * self.bm.block_size, num_loaded * self.bm.block_size
        if not readmission:
            seq.num_cached_tokens = hit_tokens + loaded_tokens
            seq.scheduled_ts = now
        self._events.append(
            ev.PrefixLookup(
                now,
                seq.request_id,
                seq.session_id,
                query_tokens=seq.num_tokens,
                hit_tokens=hit_tokens,
                hit_blocks=num_hits,
                readmission=readmission,
                reuse_gaps_s=reuse_gaps,
                tier_hit_tokens=loaded_tokens,
            )
        )
        if readmission:
            self._events.append(
                ev.Resumed(
                    now,
                    seq.request_id,
                    seq.session_id,
                    hit_tokens=hit_tokens + loaded_tokens,
                    num_preemptions=seq.num_preemptions,
                )
            )
        return not readmission

    def _preempt(self, seq: Sequence) -> None:
        num_blocks, num_lost = len(seq.block_table), seq.num_computed_tokens
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(seq)
        self._events.append(
            ev.Preempted(
                self.clock(),
                seq.request_id,
                seq.session_id,
                num_blocks_freed=num_blocks,
                num_computed_tokens_lost=num_lost,
            )
        )

    # ---- after the model ran ----------------------------------------------------------------------
    def mark_computed(self, out: SchedulerOutput) -> None:
        """The step's KV is written: advance progress and register blocks that became full."""
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.bm.register_computed_blocks(item.seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a running or waiting sequence (stop, length, abort) and free its blocks."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_ts = self.clock()
        self.bm.end_request(seq)
