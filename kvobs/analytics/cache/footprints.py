"""Per-session KV footprints: how much of the cache a session held over time, and what it lost.

Snapshots come from `kvobs serve` (one per finished request) or `kvobs collect` (one per session per interval):
`session_blocks` cached, `session_evicted_blocks` lost so far, `session_evicted_idle_blocks` lost in tool pauses
(settled: the session came back), `session_pending_idle_blocks` lost while idle with the verdict still pending.
"""

from __future__ import annotations

import pandas as pd

FOOTPRINT_COLUMNS = [
    "ts",
    "instance",
    "session_blocks",
    "session_evicted_blocks",
    "session_evicted_idle_blocks",
    "session_pending_idle_blocks",
    "session_hit_tokens",
    "hit_rate",
]


def footprint_timeline(snapshots: pd.DataFrame) -> pd.DataFrame:
    """One session's snapshots as a timeline: the footprint columns plus `lost_since_previous`."""
    frame = snapshots.sort_values("ts")[FOOTPRINT_COLUMNS].reset_index(drop=True)
    lost = frame.groupby("instance")["session_evicted_blocks"].diff().fillna(frame["session_evicted_blocks"])
    frame["lost_since_previous"] = lost.clip(lower=0).fillna(0).astype(int)
    return frame


def session_table(sessions: pd.DataFrame, footprints: pd.DataFrame, outcomes: pd.DataFrame) -> pd.DataFrame:
    """Sessions with their latest footprint and step outcomes (`reads.step_outcomes`), one row per session, ordered by
    what the cache cost them: most blocks lost in tool pauses, then most lost at all, then most failed steps.
    `hit_rate` is the one definition (`kvobs.analytics.cache.hit_rate`) over the session's steps: cached prompt tokens /
    prompt tokens, as the server reported them to the agent; `join_rate`, the share of its steps made of an agent's
    spans that the collector tied to their server request (NaN for steps nobody judged: the SDK's); `started_by`, the
    session that started it where its requests said so (a subagent's caller), and `subagents`, how many it started."""
    table = sessions.set_index("session_id")[["agent_name", "source", "started_at", "ended_at"]]
    parents = sessions["parent_session_id"] if "parent_session_id" in sessions else pd.Series(dtype=object)
    table = table.assign(
        started_by=parents.to_numpy() if len(parents) else None,
        subagents=table.index.map(parents.value_counts()).fillna(0).astype(int),
    )
    if not footprints.empty:
        latest = footprints.groupby("session_id").agg(
            blocks=("session_blocks", "sum"),
            lost=("session_evicted_blocks", "sum"),
            lost_idle=("session_evicted_idle_blocks", "sum"),
            pending_idle=("session_pending_idle_blocks", "sum"),
        )
        table = table.join(latest, how="outer")
    if not outcomes.empty:
        outcome = outcomes.set_index("session_id")
        cached, prompt = (outcome[c].astype(float) for c in ("cached_tokens", "prompt_tokens"))
        judged, joined = (outcome[c].astype(float) for c in ("judged", "joined"))
        outcome = outcome[["steps", "failed", "e2e_p50"]].assign(
            hit_rate=cached / prompt.where(prompt > 0),
            join_rate=joined / judged.where(judged > 0),  # NaN: nobody judged its steps
        )
        table = table.join(outcome.astype({"e2e_p50": float}), how="outer")
    order = [c for c in ("lost_idle", "lost", "failed") if c in table]
    table = table.sort_values(order, ascending=False, kind="stable", na_position="last") if order else table
    return table.rename_axis("session_id").reset_index()
