"""Each step's failure and slow causes for a time range, read from the store (`kvobs.analytics.attribution`).

    frame = step_causes(store, since, until)                 # one row per step started in the range
    failure_split(frame)                                     # {"cache": 0, "queue": 0, "timeout": 1, "model": 6, ...}

Requests and KV events are read from an hour before the range, so a step's previous request (the start of its
tool pause) is found; only failed sessions' events when `failed_only`.
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
    events = queries.kv_events(store, start, until, kinds=ATTRIBUTION_KINDS)
    sessions = set(steps["session_id"])
    events = events[events["session_id"].isin(sessions) | (events["kind"] == KVEventKind.CLEARED.value)]
    return attribute_steps(steps, reqs, events, failed_only=failed_only)
