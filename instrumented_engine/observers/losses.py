"""Lost blocks counted by reason: what the what-if replay reports, decided as every other observer decides it.

    tally = LossTally()
    tally.add(block_manager.take_events())
    tally.num_lost, tally.num_lost_in_pause, tally.by_reason["capacity"]

A lost block is one `BlockEvicted` (capacity, TTL, invalidation) or each block a reset (`CacheCleared`) dropped; a
block its session released (`RELEASE_REASONS`) is counted apart (`num_released`), as no loss. Idle losses count per
(session, block) that pressure took from an idle owner, settled with hindsight (`IdleLossesSettled`):
`num_lost_in_pause` (the session came back: the same losses as `kvobs_session_prefix_lost_total` and the store's
`session_evicted_idle_blocks`), `num_lost_after_end` (released or idle past the horizon; or after its next request
reached the server, before the engine took it), and `num_pending` (not
known yet). With an offload tier, `loaded` tells which blocks a session's request loaded back from it:
`num_saved_in_pause` counts the pause losses it gave back (the session recomputed none of them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import StepResult
from instrumented_engine.observers.dispatch import Handlers, dispatch
from kvobs.semconv.reasons import RELEASE_REASONS


class LossTally:
    """Args:
    tier: the replay has an offload tier: which blocks each session lost in its pause is kept for `loaded`.
    """

    def __init__(self, *, tier: bool = False) -> None:
        self.tier = tier
        self.by_reason: Counter[str] = Counter()  # eviction reason -> blocks (releases included)
        self.num_lost_in_pause = 0
        self.num_lost_after_end = 0
        self.num_pending = 0
        self.num_saved_in_pause = 0  # ... of the losses in a pause, those the session's next request loaded back
        self._pending_hashes: dict[str | None, set[int]] = {}  # session -> blocks it lost while idle, unsettled
        self._lost_in_pause: dict[str | None, set[int]] = {}  # session -> blocks lost in the pause it just ended

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

    def loaded(self, session_id: str | None, block_hashes: Iterable[int]) -> None:
        """`session_id`'s request (the first since its pause) loaded `block_hashes` from the offload tier: those it
        lost in that pause were given back."""
        lost = self._lost_in_pause.pop(session_id, None)
        if lost:
            self.num_saved_in_pause += len(lost.intersection(block_hashes))

    def _evicted(self, event: ev.BlockEvicted) -> None:
        self.by_reason[event.reason.value] += 1
        self.num_pending += len(event.pending_owners)
        if self.tier:
            for session in event.pending_owners:
                self._pending_hashes.setdefault(session, set()).add(event.block_hash)

    def _settled(self, event: ev.IdleLossesSettled) -> None:
        self.num_pending -= event.num_blocks
        hashes = self._pending_hashes.pop(event.session_id, set()) if self.tier else set()
        if event.in_pause:
            self.num_lost_in_pause += event.num_blocks
            if self.tier:
                self._lost_in_pause[event.session_id] = hashes
        else:
            self.num_lost_after_end += event.num_blocks

    def _cleared(self, event: ev.CacheCleared) -> None:
        self.by_reason[event.eviction_reason.value] += event.num_blocks

    HANDLERS: Handlers = {ev.BlockEvicted: _evicted, ev.CacheCleared: _cleared, ev.IdleLossesSettled: _settled}
