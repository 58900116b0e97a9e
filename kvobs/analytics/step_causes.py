"""Each step's failure and slow causes for a time range, read from the store (`kvobs.analytics.attribution`).

    frame = step_causes(store, since, until)                 # one row per step started in the range
    failure_split(frame)                                     # {"cache": 0, "queue": 0, "timeout": 1, "model": 6, ...}

Requests and KV events are read from an hour before the range, so a step's previous request (the start of its
tool pause) is found. With `failed_only` (the Overview's failure table) only the KV events a failed step can be
blamed on are read: its session's, from the start of the step before it to its own end (`queries.session_events`),
and the resets; a few thousand rows where the range may hold millions.
"""

from __future__ import annotations

import pandas as pd

from kvobs.analytics.attribution import ATTRIBUTION_KINDS, COLUMNS, attribute_steps
from kvobs.semconv.spans import KVEventKind, StepStatus
from kvobs.store import queries
from kvobs.store.db import Store

LOOKBACK_S = 3600.0


def step_causes(store: Store, since: float | None, until: float | None, *, failed_only: bool = False) -> pd.DataFrame:
    steps = queries.steps(store, since, until)
    if failed_only:
        failed = steps[steps["status"] == StepStatus.ERROR.value]
        steps = steps[steps["session_id"].isin(set(failed["session_id"]))]
    if steps.empty:
        return pd.DataFrame(columns=COLUMNS)
    start = None if since is None else since - LOOKBACK_S
    reqs = queries.requests(store, start, until)
    if failed_only:
        cleared = KVEventKind.CLEARED.value
        events = pd.concat([queries.session_events(store, _failed_step_windows(steps, until),
                                                   kinds=[k for k in ATTRIBUTION_KINDS if k != cleared]),
                            queries.kv_events(store, start, until, kinds=[cleared])])  # fmt: skip
    else:
        events = queries.kv_events(store, start, until, kinds=ATTRIBUTION_KINDS)
        sessions = set(steps["session_id"])
        events = events[events["session_id"].isin(sessions) | (events["kind"] == KVEventKind.CLEARED.value)]
    return attribute_steps(steps, reqs, events, failed_only=failed_only)


def _failed_step_windows(steps: pd.DataFrame, until: float | None) -> list[tuple[str, float, float]]:
    """(session, after, until] around each failed step: from the start of the step before it (its tool pause begins
    when that step's requests end, never earlier) to its end (else the next step's start, else the range's end)."""
    windows = []
    for session_id, group in steps.sort_values(["session_id", "step_index"]).groupby("session_id"):
        starts, ends = group["started_at"].to_numpy(float), group["ended_at"].to_numpy(float)
        failed = (group["status"] == StepStatus.ERROR.value).to_numpy()
        for i in range(1, len(group)):  # a session's first step in the range has no pause before it to look at
            if failed[i]:
                end = ends[i] if ends[i] == ends[i] else starts[i + 1] if i + 1 < len(group) else until
                windows.append((session_id, starts[i - 1], float("inf") if end is None else end))
    return windows
