"""The Overview's verdict tables: failed steps by failure cause and slow steps by slow cause, each read from the
verdicts a collector decided once each session settled (`kvobs.analytics.steps.verdicts`), with what was not decided
counted apart. Plain functions of (store, window), as `dashboard.data`'s."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from urllib.parse import urlencode

import pandas as pd

from kvobs.analytics.steps import SlowSteps, failure_summary, range_verdicts, slow_steps
from kvobs.store.interface import Store

FAILURE_WORDS = {
    "model": "the model answered, but not as the agent needs ({error}): the KV cache does not cause this",
    "request": "the request failed ({error}) before the cache had a part in it",
    "timeout": "it timed out, and no request of it is in the store to split its time",
    **dict.fromkeys(("cache", "queue", "engine", "tool", "outside"), "{error}"),
}


@dataclass(frozen=True)
class Failures:
    """Failed steps in the window by failure cause (`table`: `failure_kind`, `failure_cause`, `failed_steps`,
    `share`, and the latest step's `example`, `evidence`, `story`); `failed` steps, of which `decided` by the writer
    once their session settled, `pending` (timeouts of sessions still running, which a running collector decides once
    they settle), and the others attributed now."""

    table: pd.DataFrame
    failed: int
    decided: int
    pending: int


def story_url(session_id: str, step_index: int) -> str:
    """The URL (a query string) that opens a step's timeline."""
    return "?" + urlencode({"page": "step", "session": session_id, "step": int(step_index)})


def failures(store: Store, since: float, until: float, *, now: float | None = None) -> Failures:
    """Model errors as model errors, KV causes for timeouts only (`kvobs.analytics.steps.causes.range_verdicts`)."""
    verdicts = range_verdicts(store, since, until, now=now)  # now: whether a keeper runs (the wall clock's)
    summary = failure_summary(verdicts)
    failed = len(verdicts)
    decided = int(verdicts["decided"].sum()) if failed else 0
    pending = int(verdicts["pending"].sum()) if failed else 0
    if summary.empty:
        return Failures(summary, failed, decided, pending)
    latest = verdicts.sort_values("started_at").groupby(["failure_kind", "failure_cause"]).tail(1)
    latest = latest.set_index(["failure_kind", "failure_cause"])
    rows = []
    for row in summary.itertuples(index=False):
        step = latest.loc[(row.failure_kind, row.failure_cause)]
        rows.append(
            {
                "example": f"{step['session_id']} step {int(step['step_index'])}",
                "evidence": step["evidence"] or FAILURE_WORDS[row.failure_kind].format(error=step["error_type"]),
                "story": story_url(step["session_id"], int(step["step_index"])),
            }
        )
    return Failures(pd.concat([summary, pd.DataFrame(rows)], axis=1), failed, decided, pending)


def slow(store: Store, since: float, until: float, *, now: float | None = None) -> SlowSteps:
    """`slow_steps` of the window, each cause's latest step with the URL of its timeline (`story`)."""
    found = slow_steps(store, since, until, now=time.time() if now is None else now)
    table = found.table
    return replace(
        found, table=table.assign(story=[story_url(s, i) for s, i in zip(table.session_id, table.step_index)])
    )
