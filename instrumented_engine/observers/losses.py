"""Lost blocks counted by reason: what the what-if replay reports, decided as every other observer decides it.

    tally = LossTally()
    tally.add(block_manager.take_events())
    tally.num_lost, tally.num_lost_in_pause, tally.by_reason["capacity"]

A lost block is one `BlockEvicted` (capacity, TTL, invalidation) or each block a reset (`CacheCleared`) dropped; a
block its session released (`RELEASE_REASONS`) is counted apart (`num_released`), as no loss. Idle losses count per
(session, block) that pressure took from an idle owner, settled with hindsight (`IdleLossesSettled`):
`num_lost_in_pause` (the session came back: the same losses as `kvobs_session_prefix_lost_total` and the store's
`session_evicted_idle_blocks`), `num_lost_after_end` (released or idle past the horizon), and `num_pending` (not
known yet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import StepResult
from instrumented_engine.observers.dispatch import Handlers, dispatch
from kvobs.semconv.reasons import RELEASE_REASONS


class LossTally:
    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()  # eviction reason -> blocks (releases included)
        self.num_lost_in_pause = 0
        self.num_lost_after_end = 0
        self.num_pending = 0

    @property
    def num_lost(self) -> int:
        return sum(n for reason, n in self.by_reason.items() if reason not in RELEASE_REASONS)

    @property
    def num_released(self) -> int:
        return sum(n for reason, n in self.by_reason.items() if reason in RELEASE_REASONS)

    def on_step(self, result: StepResult) -> None:
        self.add(result.events)

    def add(self, events: Iterable[ev.KVEvent]) -> None:
        dispatch(self, self.HANDLERS, events)

    def _evicted(self, event: ev.BlockEvicted) -> None:
        self.by_reason[event.reason.value] += 1
        self.num_pending += len(event.pending_owners)

    def _settled(self, event: ev.IdleLossesSettled) -> None:
        self.num_pending -= event.num_blocks
        if event.in_pause:
            self.num_lost_in_pause += event.num_blocks
        else:
            self.num_lost_after_end += event.num_blocks

    def _cleared(self, event: ev.CacheCleared) -> None:
        self.by_reason[event.eviction_reason.value] += event.num_blocks

    HANDLERS: Handlers = {ev.BlockEvicted: _evicted, ev.CacheCleared: _cleared, ev.IdleLossesSettled: _settled}
