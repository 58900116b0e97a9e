"""A step's verdict as one typed record (`kvobs.store.rows.StepVerdictRecord`): why it failed, whether it was slow
and why (with the cause's share of its excess), its latency's parts against its session's typical step, and the
evidence. The collector's keeper decides it once the step's session settles (`collectors/jobs/step_verdicts.py`) and
writes it; a page that finds a step no keeper decided works out the same record (not stored).

    records = verdict_records(attribute_steps(...), decided_at=now)   # one per attributed step
    frame = verdict_frame(store.reads.step_verdicts(since, until))    # as stored, or `verdict_frame(records)`

A slow cause is `none` for a step that was not slow. A row written before every step was decided (a failed step's
only) has NULL in the slow columns: the pages count it among the failures, never as "not slow".
"""

from __future__ import annotations

import json
import math
from dataclasses import fields

import pandas as pd

from kvobs.analytics.steps.attribution import COLUMNS, FAILURE_KINDS
from kvobs.analytics.steps.excess import FAILURE_KIND_OF
from kvobs.analytics.steps.step_verdict import FACTS, facts_json, plain
from kvobs.store.rows import StepVerdictRecord

VERDICT_FIELDS = tuple(f.name for f in fields(StepVerdictRecord))
# the record's fields that `attribute_steps` names otherwise
_RENAMED = {"slow_s": "dominant_s", "slow_share": "dominant_share"}
_INTS = ("step_index", "num_requests")


def verdict_records(attributed: pd.DataFrame, decided_at: float) -> list[StepVerdictRecord]:
    """One record per row of `attribute_steps`' frame, decided at `decided_at`, with its other columns as `detail`."""
    if attributed.empty:
        return []
    frame = attributed.rename(columns={v: k for k, v in _RENAMED.items()}).assign(decided_at=decided_at)
    present = [c for c in FACTS if c in frame]
    details = [facts_json(dict(zip(present, row))) for row in frame[present].itertuples(index=False, name=None)]
    return _records(frame.assign(detail=details))


def decided_steps(stored: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame | None:
    """`attribute_steps`' frame for `steps` as their keeper decided it (`stored`: `reads.step_verdicts` of their
    session), `verdict` `DECIDED`, with nothing attributed again; None unless every step has a whole stored verdict
    with its `detail` (a row decided before 0028, or a step not decided yet: the page attributes)."""
    if steps.empty or stored.empty or "detail" not in stored:
        return None
    whole = stored[stored["causes"].notna() & stored["detail"].notna()]
    if set(steps["step_index"].astype(int)) - set(whole["step_index"].astype(int)):
        return None
    rows = []
    for record in _records(whole):
        row = {_RENAMED.get(name, name): value for name, value in record.to_row().items()}
        row.update(json.loads(row.pop("detail")))
        rows.append(row)
    frame = pd.DataFrame.from_records(rows).reindex(columns=[*COLUMNS, "decided_at"]).infer_objects()
    frame["evidence"] = frame["evidence"].fillna("")  # as `with_decided` lays a stored verdict over a page's
    frame = frame[frame["step_index"].isin(steps["step_index"].astype(int))]
    frame = frame.sort_values("step_index", kind="stable").reset_index(drop=True)
    return frame[COLUMNS].assign(verdict=DECIDED, decided_at=frame["decided_at"].astype(float))


COST_KINDS = (*FAILURE_KINDS, "none")  # what cost a step, as `cost_kind` names it


def cost_kind(failure_kind: str | None, slow: bool | None, slow_cause: str | None) -> str:
    """What cost a step, as a kind (`COST_KINDS`): a failed step's failure kind; a slow step's cause's kind (`cache`
    for a prefix lost, invalidated or routed away, or a preemption; `queue`, `engine`, `tool`, `outside`); `none` for
    a step that neither failed nor was slow."""
    if isinstance(failure_kind, str):
        return failure_kind
    if slow and isinstance(slow_cause, str):
        return FAILURE_KIND_OF.get(slow_cause, "none")
    return "none"


def session_verdicts(attributed: pd.DataFrame, stored: pd.DataFrame, *, now: float) -> list[StepVerdictRecord]:
    """Each attributed step's verdict: the one a keeper decided (`stored`, `reads.step_verdicts`) where there is one
    of the whole step (a row stored before every step was decided has no slow verdict: worked out instead), else
    `verdict_records` of the page's own attribution, decided `now`."""
    whole = stored[stored["causes"].notna()] if len(stored) else stored
    decided = {int(i): row for i, row in zip(whole["step_index"], _records(whole))} if len(whole) else {}
    worked = verdict_records(attributed[~attributed["step_index"].astype(int).isin(list(decided))], now)
    return sorted([*decided.values(), *worked], key=lambda v: v.step_index)


def _records(frame: pd.DataFrame) -> list[StepVerdictRecord]:
    """Rows as records: the `VERDICT_FIELDS` the frame has, missing values as None."""
    present = [name for name in VERDICT_FIELDS if name in frame]
    return [
        StepVerdictRecord(**{name: _value(name, value) for name, value in zip(present, row)})
        for row in frame[present].itertuples(index=False, name=None)
    ]


def verdict_frame(verdicts: list[StepVerdictRecord] | pd.DataFrame) -> pd.DataFrame:
    """Verdicts as a frame of `VERDICT_FIELDS` (stored rows, or records), by session and step."""
    if isinstance(verdicts, pd.DataFrame):
        frame = verdicts.reindex(columns=list(VERDICT_FIELDS))
    else:
        frame = pd.DataFrame([v.to_row() for v in verdicts], columns=list(VERDICT_FIELDS))
    return frame.sort_values(["session_id", "step_index"], kind="stable").reset_index(drop=True)


def _value(name: str, value):
    """A frame's cell as the record holds it: None for a missing value, plain Python numbers and text."""
    value = plain(value)
    if value is None:
        return None
    if name in _INTS:
        return int(value)
    if name == "slow":
        return bool(value)
    return value if not (isinstance(value, str) and name in ("evidence", "causes") and not value) else None


DECIDED, WORKED_OUT = "decided", "worked out"  # where a page's verdict came from
_FAILURE = ("failure_cause", "failure_kind", "evidence")
_SLOW = ("slow", "slow_cause", "cause", "causes")


def with_decided(attributed: pd.DataFrame, stored: pd.DataFrame) -> pd.DataFrame:
    """`attribute_steps`' rows with the verdicts a keeper decided (`stored`: `reads.step_verdicts`) in place of the
    page's own, `verdict`: `DECIDED` or `WORKED_OUT`, and `decided_at` (NaN where worked out). A row stored before
    every step was decided (a failed step's, no slow verdict) gives its failure verdict only."""
    out = attributed.assign(verdict=WORKED_OUT, decided_at=math.nan)
    if stored.empty or out.empty:
        return out
    keys = stored.set_index(stored["step_index"].astype("int64"))
    at = out.index[out["step_index"].astype("int64").isin(keys.index)]
    if not len(at):
        return out
    found = keys.loc[out.loc[at, "step_index"].astype("int64")]
    out.loc[at, "verdict"] = DECIDED
    out.loc[at, "decided_at"] = found["decided_at"].to_numpy(float)
    for column in _FAILURE:
        out.loc[at, column] = found[column].fillna("" if column == "evidence" else None).to_numpy(object)
    whole = found["causes"].notna().to_numpy(bool)
    for column in _SLOW:
        values = found[column].to_numpy(object)[whole]
        out.loc[at[whole], column] = values.astype(bool) if column == "slow" else values
    return out
