"""Per-session KV footprints: how much of the cache a session held over time, and what it lost.

Snapshots come from `kvobs serve` (one per finished request) or `kvobs collect` (one per session per interval):
`session_blocks` cached, `session_evicted_blocks` lost so far, `session_evicted_idle_blocks` lost in tool pauses
(settled: the session came back), `session_pending_idle_blocks` lost while idle with the verdict still pending.
"""

from __future__ import annotations

import pandas as pd

FOOTPRINT_COLUMNS = ["ts", "instance", "session_blocks", "session_evicted_blocks", "session_evicted_idle_blocks",
                     "session_pending_idle_blocks",
                     "session_hit_tokens", "hit_rate"]  # fmt: skip


def footprint_timeline(snapshots: pd.DataFrame) -> pd.DataFrame:
    """One session's snapshots as a timeline: the footprint columns plus `lost_since_previous`."""
    frame = snapshots.sort_values("ts")[FOOTPRINT_COLUMNS].reset_index(drop=True)
    lost = frame.groupby("instance")["session_evicted_blocks"].diff().fillna(frame["session_evicted_blocks"])
    frame["lost_since_previous"] = lost.clip(lower=0).fillna(0).astype(int)
    return frame


def session_table(sessions: pd.DataFrame, footprints: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Sessions with their latest footprint and step outcomes: one row per session, most lost while idle first."""
    table = sessions.set_index("session_id")[["agent_name", "source", "started_at", "ended_at"]]
    if not footprints.empty:
        latest = footprints.groupby("session_id").agg(
            blocks=("session_blocks", "sum"), lost=("session_evicted_blocks", "sum"),
            lost_idle=("session_evicted_idle_blocks", "sum"), pending_idle=("session_pending_idle_blocks", "sum"),
            hit_rate=("hit_rate", "mean"),
        )  # fmt: skip
        table = table.join(latest, how="outer")
    if not steps.empty:
        outcome = steps.groupby("session_id").agg(
            steps=("step_index", "size"), failed=("status", lambda s: int((s == "error").sum())),
            e2e_p50=("e2e_s", "median"),
        )  # fmt: skip
        table = table.join(outcome, how="outer")
    order = [c for c in ("lost_idle", "failed") if c in table]
    table = table.sort_values(order, ascending=False) if order else table
    return table.rename_axis("session_id").reset_index()
