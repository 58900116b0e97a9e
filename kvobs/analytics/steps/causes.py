"""Each step's failure and slow causes for a time range, read from the store (`kvobs.analytics.steps.attribution`).

    frame = step_causes(store, since, until)                 # one row per step started in the range
    failure_split(frame)                                     # {"cache": 0, "queue": 0, "timeout": 1, "model": 6, ...}
    failure_summary(failure_verdicts(store, since, until))   # failed steps' verdicts: timeouts attributed only
    failure_summary(range_verdicts(store, since, until))     # the Overview's: those a collector decided, and the rest

Requests and KV events are read from an hour before the range, so a step's previous request (the start of its tool
pause) is found. On a fleet (a store that heard of two instances or more) each request's routing loss is read too
(`kvobs.analytics.cache.routing.request_routing`: as the collector measured it, else replayed). With `failed_only` only
the KV events a failed step can be blamed on are read: its session's, from the start of the step before it to its own
end (`reads.session_events`), and the resets; a few thousand rows where the range may hold millions. A failed step's
verdict (`failure_verdicts`) goes further: only a timeout can have a KV cause, so only timeouts are attributed, and a
range whose failures are model or request errors reads no KV event at all. The Overview reads the verdicts the collector
decided once each session settled (`collectors/jobs/step_verdicts.py`) and works out only the others (`range_verdicts`).
"""

from __future__ import annotations

import time
from collections.abc import Collection

import numpy as np
import pandas as pd

from kvobs.analytics.cache import PrefillRates, request_routing
from kvobs.analytics.steps.attribution import (
    ATTRIBUTION_KINDS,
    COLUMNS,
    attribute_steps,
    attributed_mask,
    failure_verdict,
)
from kvobs.semconv.spans import KVEventKind, StepErrorType, StepStatus
from kvobs.store.interface import Store

LOOKBACK_S = 3600.0
VERDICT_INTERVAL_S = 60.0  # how often a collector's keeper decides (`collectors.jobs.step_verdicts`)
KEEPER_LIVE_S = 5 * VERDICT_INTERVAL_S  # a keeper whose latest run is older is taken as stopped
PENDING = "pending"  # a timeout's cause until a keeper decides it
PENDING_WORDS = "its session is still running: the collector decides the verdict once the session settles"
VERDICT_COLUMNS = [
    "session_id",
    "step_index",
    "status",
    "error_type",
    "started_at",
    "trace_id",
    "span_id",
    "failure_cause",
    "failure_kind",
    "evidence",
]


def step_causes(
    store: Store,
    since: float | None,
    until: float | None,
    *,
    failed_only: bool = False,
    error_types: Collection[str] | None = None,
    steps: pd.DataFrame | None = None,
    whole_sessions: bool = False,
) -> pd.DataFrame:
    """One row per step started in the range (`steps`, when the caller has read them already); with `failed_only`,
    per failed step (of `error_types`, when given). `whole_sessions`: `steps` are every step of their sessions (a
    verdict keeper's), so their KV events are read by session, not every session's in the range."""
    steps = store.reads.steps(since, until) if steps is None else steps
    if failed_only:
        steps = steps.assign(wanted=attributed_mask(steps, error_types))
        steps = steps[steps["session_id"].isin(set(steps.loc[steps["wanted"], "session_id"]))]
    if steps.empty:
        return pd.DataFrame(columns=COLUMNS)
    start = None if since is None else since - LOOKBACK_S  # >= prefill_rates.RATE_WINDOW_S
    reqs = store.reads.requests(start, until)
    rates = PrefillRates.from_store(store, start, until, requests=reqs)
    if failed_only:
        cleared, timing = KVEventKind.CLEARED.value, (KVEventKind.PREEMPTED.value, KVEventKind.HIT.value)
        events = pd.concat(
            [
                store.reads.session_events(
                    _failed_step_windows(steps, until),
                    kinds=[k for k in ATTRIBUTION_KINDS if k != cleared and k not in timing],
                ),
                # every step's preemptions and re-admissions: the parts of its session's typical step
                store.reads.session_events(_session_windows(steps, until), kinds=timing),
                store.reads.kv_events(start, until, kinds=[cleared]),
            ]
        )
    elif whole_sessions:
        cleared = KVEventKind.CLEARED.value
        events = pd.concat(
            [
                store.reads.session_events(
                    _session_windows(steps, until), kinds=[k for k in ATTRIBUTION_KINDS if k != cleared]
                ),
                store.reads.kv_events(start, until, kinds=[cleared]),
            ]
        )
    else:
        events = store.reads.kv_events(start, until, kinds=ATTRIBUTION_KINDS)
        sessions = set(steps["session_id"])
        events = events[events["session_id"].isin(sessions) | (events["kind"] == KVEventKind.CLEARED.value)]
    routing = request_routing(store, reqs[reqs["arrival_ts"] >= steps["started_at"].min()], steps, since, until)
    return attribute_steps(
        steps, reqs, events, rates=rates, failed_only=failed_only, error_types=error_types, routing=routing
    )


def failure_verdicts(
    store: Store, since: float | None, until: float | None, *, steps: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each failed step started in the range (of `steps`, when the caller has read them: its sessions' steps, for
    their typical step), with its `failure_cause` and `failure_kind` (columns `VERDICT_COLUMNS`; what
    `failure_summary` counts). Only a timeout is given a KV or queue cause, so only timeouts are attributed against
    their requests and the KV events around them; any other failure's verdict is its error, exactly as the analysis
    of every step gives it, and costs no read of KV events."""
    steps = store.reads.steps(since, until) if steps is None else steps
    failed = steps[steps["status"] == StepStatus.ERROR.value]
    timeout = failed["error_type"] == StepErrorType.TIMEOUT.value
    frame = error_verdicts(failed[~timeout])
    if timeout.any():
        attributed = step_causes(
            store, since, until, failed_only=True, error_types=[StepErrorType.TIMEOUT.value], steps=steps
        )[VERDICT_COLUMNS]
        frame = attributed if frame.empty else pd.concat([frame, attributed])
    return frame.sort_values(["session_id", "step_index"]).reset_index(drop=True)


def error_verdicts(failed: pd.DataFrame) -> pd.DataFrame:
    """The verdicts of failed steps other than timeouts: each one's error, with no read (`VERDICT_COLUMNS`)."""
    verdicts = [failure_verdict(error) for error in failed["error_type"]]
    causes, kinds = [v[0] for v in verdicts], [v[1] for v in verdicts]
    return failed.assign(failure_cause=causes, failure_kind=kinds, evidence="")[VERDICT_COLUMNS]


def range_verdicts(store: Store, since: float | None, until: float | None, *, now: float | None = None) -> pd.DataFrame:
    """`failure_verdicts` of the range as a page reads them: the verdicts a writer decided once their session settled
    (`reads.step_verdicts`); a timeout of a session still running (no `ended_at`) without one that a running keeper
    will decide (`keeper_covers_from`) as pending (cause `PENDING`: what its KV record says may still change); the other
    failed steps without one (a store no collector keeps verdicts for) attributed now, with their sessions' steps.
    Reads the failed steps and those sessions' steps, not every step of the range. Columns `decided` and `pending`:
    which were read, which wait for the keeper."""
    failed = store.reads.steps(since, until, status=StepStatus.ERROR.value)
    decided = store.reads.step_verdicts(since, until, status=StepStatus.ERROR.value)
    known = decided[VERDICT_COLUMNS].fillna({"evidence": ""}).assign(decided=True, pending=False)  # "" for none
    undecided = _without(failed, known)
    covers_from = keeper_covers_from(store, time.time() if now is None else now) if len(undecided) else None
    if covers_from is not None:  # decided and pending: what the page does not work out
        timeouts = undecided["error_type"] == StepErrorType.TIMEOUT.value
        ended = store.lookups.session_ends(sorted(set(undecided.loc[timeouts, "session_id"]))) if timeouts.any() else {}
        running = ~undecided["session_id"].isin(list(ended))  # an ended session's verdict can no longer change
        waits = timeouts & running & (undecided["started_at"] >= covers_from)
        pending = undecided[waits].assign(failure_cause=PENDING, failure_kind="timeout", evidence=PENDING_WORDS)
        known = pd.concat([known, pending[VERDICT_COLUMNS].assign(decided=False, pending=True)])
        undecided = undecided[~waits]
    if not (undecided["error_type"] == StepErrorType.TIMEOUT.value).any():  # the others need no read
        worked = error_verdicts(undecided)
    else:
        mine = store.reads.steps(since, until, session_ids=sorted(set(undecided["session_id"])))  # the typical step
        # from their sessions' first step in the range (running sessions: the range's last minutes, not all of it)
        first = float(mine["started_at"].min())
        worked = failure_verdicts(store, first if since is None else max(since, first), until, steps=mine)
        worked = _without(worked, known)
    worked = worked.assign(decided=False, pending=False)
    frame = worked if known.empty else pd.concat([known, worked], ignore_index=True)
    return frame.sort_values(["session_id", "step_index"]).reset_index(drop=True)


def keeper_covers_from(store: Store, now: float) -> float | None:
    """Where the verdict keepers running now (`verdict_progress`, a run within `KEEPER_LIVE_S` of `now`) decide from:
    every failed step started since will be decided once its session settles; None when no keeper runs."""
    progress = store.reads.verdict_progress()
    covers_from = pd.to_numeric(progress["covers_from"], errors="coerce").to_numpy(float)
    live = progress[(progress["updated_at"] >= now - KEEPER_LIVE_S) & np.isfinite(covers_from)]
    return float(live["covers_from"].min()) if len(live) else None  # (a stopped keeper's mark covers nothing)


def _without(steps: pd.DataFrame, others: pd.DataFrame) -> pd.DataFrame:
    """The rows of `steps` whose (session, step index) is not among those of `others`."""
    if steps.empty or others.empty:
        return steps
    return steps[~_step_keys(steps).isin(_step_keys(others))]


def _step_keys(frame: pd.DataFrame) -> pd.MultiIndex:
    return pd.MultiIndex.from_arrays([frame["session_id"].astype(object), frame["step_index"].astype("int64")])


def _session_windows(steps: pd.DataFrame, until: float | None) -> list[tuple[str, float, float]]:
    """(session, after, until] from each session's first step in `steps` on (its requests may end after `until`)."""
    firsts = steps.groupby("session_id")["started_at"].min()
    return [(session_id, float(first) - 1e-6, float("inf")) for session_id, first in firsts.items()]


def _failed_step_windows(steps: pd.DataFrame, until: float | None) -> list[tuple[str, float, float]]:
    """(session, after, until] around each failed step: from the start of the step before it (its tool pause begins
    when that step's requests end, never earlier) to its end (else the next step's start, else the range's end)."""
    windows = []
    for session_id, group in steps.sort_values(["session_id", "step_index"]).groupby("session_id"):
        starts, ends = group["started_at"].to_numpy(float), group["ended_at"].to_numpy(float)
        failed = group["wanted"].to_numpy(bool)
        for i in range(1, len(group)):  # a session's first step in the range has no pause before it to look at
            if failed[i]:
                end = ends[i] if ends[i] == ends[i] else starts[i + 1] if i + 1 < len(group) else until
                windows.append((session_id, starts[i - 1], float("inf") if end is None else end))
    return windows
