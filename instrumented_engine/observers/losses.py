"""Lost blocks counted by reason: what the what-if replay reports, decided as every other observer decides it.

    tally = LossTally()
    tally.add(block_manager.take_events())
    tally.num_lost, tally.num_lost_in_pause, tally.by_reason["capacity"]

A lost block is one `BlockEvicted` (capacity, TTL, invalidation, release) or each block a reset (`CacheCleared`)
dropped. `num_lost_in_pause` counts the blocks pressure took while an owning session waited on a tool
(`BlockEvicted.lost_in_pause`), the same blocks `kvobs_session_prefix_lost_total` and the store's
`session_evicted_idle_blocks` count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import StepResult
from instrumented_engine.observers.dispatch import dispatch


class LossTally:
    def __init__(self) -> None:
        self.by_reason: Counter[str] = Counter()  # eviction reason -> blocks
        self.num_lost_in_pause = 0

    @property
    def num_lost(self) -> int:
        return sum(self.by_reason.values())

    def on_step(self, result: StepResult) -> None:
        self.add(result.events)

    def add(self, events: Iterable[ev.KVEvent]) -> None:
        dispatch(self, self.HANDLERS, events)

    def _evicted(self, event: ev.BlockEvicted) -> None:
        self.by_reason[event.reason.value] += 1
        self.num_lost_in_pause += event.lost_in_pause

    def _cleared(self, event: ev.CacheCleared) -> None:
        self.by_reason[event.eviction_reason.value] += event.num_blocks

    HANDLERS = {ev.BlockEvicted: _evicted, ev.CacheCleared: _cleared}
