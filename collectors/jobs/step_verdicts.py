"""Each step's verdict (`kvobs.analytics.steps.verdicts`: its failure cause, its slow cause, its latency's parts),
decided once its session has settled and written to the store (`step_verdicts`), so the pages read verdicts instead of
attributing every step of their range again.

    keeper = VerdictKeeper(store, write=lambda records: ..., progress=lambda record: ...)
    keeper.run(now)        # every VERDICT_INTERVAL_S from the collector's tick; returns how many it decided

A step's verdict weighs the step against its session's typical step (its other steps) and reads the KV events up to
its end (`step_causes(..., whole_sessions=True)`: the session's own events), so it is decided when nothing later is
expected to change it:
its session ended (`sessions.ended_at`, the agent SDK's) or started no step for `SESSION_END_AFTER_S` (the horizon
engine, collector and SDK share for a session's end), read `DELAY_S` behind now so late spans have landed. A
session that comes back later is decided again when it settles again, with all its steps (an upsert: the later
decision wins). Steps are read once, in time order, from where the last run stopped; a keeper that starts reads
back `LOOKBACK_S`. After each run it marks where it decides from and how far it has read (`verdict_progress`, one
row per keeper): while that mark is fresh (`KEEPER_LIVE_S`), the page shows a step of a session still running that
it has not decided yet as pending (a timeout's cause, a slow cause) instead of attributing it as it opens; a failed
step it has not decided (a store no collector keeps, a session that has ended) the page attributes when it is read.
At the collector's stop
the keeper decides what has settled and marks itself stopped (`stop`): nothing it left is pending after that.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable

import pandas as pd

from kvobs.analytics.steps import cost_kind, step_causes, verdict_records
from kvobs.semconv.sessions import SESSION_END_AFTER_S, SESSION_IDLE_S
from kvobs.store.interface import Store
from kvobs.store.leases import holder_name
from kvobs.store.rows import StepVerdictRecord, VerdictProgressRecord

log = logging.getLogger(__name__)

DELAY_S = 60.0  # how far behind now a run reads: the writer's queue and late spans have landed
LOOKBACK_S = SESSION_IDLE_S  # how far back a keeper that starts reads steps
CHUNK = 200  # sessions decided per round of reads
STOPPED = math.inf  # a stopped keeper's `covers_from`: it will decide no step, wherever it started


class VerdictKeeper:
    def __init__(
        self,
        store: Store,
        write: Callable[[list[StepVerdictRecord]], None],
        *,
        progress: Callable[[VerdictProgressRecord], object] | None = None,
        delay_s: float = DELAY_S,
        end_after_s: float = SESSION_END_AFTER_S,
        lookback_s: float = LOOKBACK_S,
    ) -> None:
        self.store, self.write, self.progress = store, write, progress
        self.name = holder_name("verdicts")  # this keeper's row in `verdict_progress`
        self.covers_from: float | None = None  # every failed step started from here is decided once settled
        self.delay_s, self.end_after_s, self.lookback_s = delay_s, end_after_s, lookback_s
        self.done: float | None = None  # steps started up to here have been read
        self.pending: dict[str, float] = {}  # session with steps not yet decided -> its last step's time
        self.num_decided = 0  # verdicts written, ever
        self.decided_by_kind: Counter[str] = Counter()  # of them, by what cost the step (`verdicts.cost_kind`)

    def run(self, now: float) -> int:
        """Read the steps started since the last run; decide the steps of every session that has settled."""
        written = now - self.delay_s
        start = written - self.lookback_s if self.done is None else self.done
        if written <= start:
            return 0
        self._note(self.store.reads.steps(start, written))
        self.done = written
        self.covers_from = start if self.covers_from is None else self.covers_from
        decided = self._settle(written, now) if self.pending else 0
        if self.progress is not None:  # after deciding: a verdict is stored before its step stops being pending
            self.progress(VerdictProgressRecord(self.name, self.covers_from, written, now))
        return decided

    def stop(self, now: float) -> int:
        """At the collector's stop (its steps flushed to the store): decide every session that has settled by now,
        then mark the keeper stopped (`STOPPED`: its mark covers nothing), so a page attributes whatever it left
        undecided instead of showing it as pending for a keeper that will not come."""
        start = now - self.lookback_s if self.done is None else self.done
        if now > start:
            self._note(self.store.reads.steps(start, now))
            self.done = now
        decided = self._settle(now, now) if self.pending else 0
        if self.progress is not None:
            self.progress(VerdictProgressRecord(self.name, STOPPED, self.done or now, now))
        return decided

    def _settle(self, written: float, now: float) -> int:
        """Decide the pending sessions that have settled by `written`."""
        ended = self.store.lookups.session_ends(list(self.pending))
        settled = sorted(s for s, last in self.pending.items() if s in ended or last <= written - self.end_after_s)
        decided = 0
        for i in range(0, len(settled), CHUNK):
            chunk = settled[i : i + CHUNK]
            decided += self._decide(chunk, now)
            for session_id in chunk:
                del self.pending[session_id]
        return decided

    def _note(self, steps: pd.DataFrame) -> None:
        """Remember the sessions with new steps, and when each was last seen."""
        if steps.empty:
            return
        last = steps[["started_at", "ended_at"]].max(axis=1).groupby(steps["session_id"]).max()
        for session_id, ts in last.items():
            self.pending[session_id] = max(self.pending.get(session_id, float(ts)), float(ts))

    def _decide(self, sessions: list[str], now: float) -> int:
        steps = self.store.reads.steps(session_ids=sessions)
        if steps.empty:
            return 0
        first, last = float(steps["started_at"].min()), float(steps[["started_at", "ended_at"]].max().max())
        records = verdict_records(step_causes(self.store, first, last, steps=steps, whole_sessions=True), now)
        if records:
            self.write(records)
            self.num_decided += len(records)
            self.decided_by_kind.update(cost_kind(r.failure_kind, r.slow, r.slow_cause) for r in records)
            log.debug("decided %d step(s) of %d settled session(s)", len(records), len(sessions))
        return len(records)
