"""The slow steps of a time range by slow cause, read from the verdicts a collector decided once each session settled
(`step_verdicts`, `kvobs.analytics.steps.verdicts`), never worked out as a page opens: a range's steps no keeper decided
are counted, as pending (a session still running that a running keeper will decide) or not decided (no keeper kept
them), and never shown as "not slow". Three small reads: the decided verdicts counted in the database, the slow ones,
the steps with no verdict.

    slow = slow_steps(store, since, until, now=time.time())
    slow.table          # slow_cause, slow_steps, of_weighed (share of the weighed), slow_s (median), latest step
    slow.steps, slow.decided, slow.weighed, slow.pending, slow.undecided
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.steps.causes import keeper_covers_from
from kvobs.store.interface import Store

COLUMNS = ["slow_cause", "slow_steps", "of_weighed", "slow_s", "session_id", "step_index", "evidence"]


@dataclass(frozen=True)
class SlowSteps:
    """`table`: a row per slow cause (most steps first), with its latest step and that step's evidence; the counts
    of the range's steps: `decided` (a stored verdict), `weighed` (decided with a slow verdict: slow or not; a row
    stored before every step was decided has none), `pending` (a running keeper decides them once their session
    settles), `undecided` (no keeper decided them)."""

    table: pd.DataFrame
    steps: int
    decided: int
    weighed: int
    pending: int
    undecided: int

    @property
    def slow(self) -> int:
        return int(self.table["slow_steps"].sum()) if len(self.table) else 0


def slow_steps(store: Store, since: float | None, until: float | None, *, now: float) -> SlowSteps:
    """The range's slow steps by cause, from the stored verdicts (`now`: whether a keeper runs, by its mark)."""
    decided, weighed = store.lookups.verdict_counts(since, until)
    open_ = store.reads.undecided_steps(since, until)
    pending = 0
    covers_from = keeper_covers_from(store, now) if len(open_) else None
    if covers_from is not None:
        ended = store.lookups.session_ends(sorted(set(open_["session_id"])))
        running = ~open_["session_id"].isin(list(ended))
        pending = int((running & (open_["started_at"] >= covers_from)).sum())
    return SlowSteps(
        table=_by_cause(store.reads.step_verdicts(since, until, slow=True), weighed),
        steps=decided + len(open_),
        decided=decided,
        weighed=weighed,
        pending=pending,
        undecided=len(open_) - pending,
    )


def _by_cause(slow: pd.DataFrame, weighed: int) -> pd.DataFrame:
    if slow.empty:
        return pd.DataFrame(columns=COLUMNS)
    grouped = slow.groupby("slow_cause")
    out = pd.DataFrame({"slow_steps": grouped.size(), "slow_s": grouped["slow_s"].median()})
    latest = slow.sort_values("started_at", kind="stable").groupby("slow_cause").tail(1).set_index("slow_cause")
    out = out.join(latest[["session_id", "step_index", "evidence"]]).reset_index()
    out["of_weighed"] = out["slow_steps"] / weighed
    out["step_index"] = out["step_index"].astype(int)
    return out.sort_values(["slow_steps", "slow_cause"], ascending=[False, True]).reset_index(drop=True)[COLUMNS]
