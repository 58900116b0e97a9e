"""The hit rate against the pause before each step: how long a session waited (on its tools) before a step, and how
much of the step's prompt the engine found cached, per tool; and the curve of a TTL pin, the share of those steps
whose pause was at most T seconds, so whose prefix a pin of T (a session's blocks kept for T after its request,
`session_ttl`) would have kept, given room to keep it.

    frame = step_pauses(store.reads.steps(since, until), store.reads.requests(since, until))
    frame[["session_id", "step_index", "pause_s", "tool", "hit_rate", "prompt_tokens"]]
    pin_curve(frame, ttls=[1, 5, 30])   # ttl_s, steps (their share), prompt tokens (their share)

A pause is what the engine saw of the session's wait (`pause_before`, as a step's story draws it): from the end of
the previous step's last request to the arrival of this step's first (a step's own tool calls run inside the step),
the steps' own times where their requests are not known. The step's hit rate is its usage's (`cached_tokens /
prompt_tokens`, what the engine's response said); a step whose usage does not say is left out of the rates and
counted (`not_measured`), never shown as 0. The tool is what the step's spans recorded
in its pause (`steps.tools`: names joined by "+"), `NO_TOOL` where none was recorded.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from kvobs.analytics.steps.attribution import step_requests

NO_TOOL = "no tool recorded"
COLUMNS = ["session_id", "step_index", "pause_s", "tool", "hit_rate", "prompt_tokens", "cached_tokens"]


def pause_before(previous_step, previous_sent: pd.DataFrame, step, sent: pd.DataFrame) -> tuple[float, float] | None:
    """The pause before `step` (start, end): from the last finish of the requests its session's previous step sent
    (`previous_sent`; that step's end where none finished) to the first arrival of its own (`sent`; its start
    where none arrived); None where the start is unknown."""
    before = previous_sent["finished_ts"].dropna()
    start = float(before.max()) if len(before) else previous_step["ended_at"]
    end = float(sent["arrival_ts"].min()) if len(sent) else float(step["started_at"])
    return None if pd.isna(start) else (float(start), end)


def step_pauses(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per step after a pause in its session (`COLUMNS`), `hit_rate` NaN where its usage does not say."""
    if steps.empty:
        return pd.DataFrame(columns=COLUMNS)
    ordered = steps.sort_values(["session_id", "step_index"], kind="stable").reset_index(drop=True)
    sent = step_requests(requests, ordered)
    pause = [np.nan] * len(ordered)
    for i in range(1, len(ordered)):
        if ordered.at[i, "session_id"] == ordered.at[i - 1, "session_id"]:
            span = pause_before(ordered.iloc[i - 1], sent[i - 1], ordered.iloc[i], sent[i])
            pause[i] = np.nan if span is None else span[1] - span[0]
    after = ordered.assign(pause_s=pause)
    after = after[after["pause_s"].notna() & (after["pause_s"] >= 0)]
    prompt = after["prompt_tokens"].astype(float)
    cached = after["cached_tokens"].astype(float)
    rate = (cached / prompt.where(prompt > 0)).where(cached.notna())
    tools = after["tools"] if "tools" in after else pd.Series(None, index=after.index)
    return pd.DataFrame(
        {
            "session_id": after["session_id"],
            "step_index": after["step_index"],
            "pause_s": after["pause_s"].astype(float),
            "tool": [_tool(t) for t in tools],
            "hit_rate": rate,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
        }
    ).reset_index(drop=True)[COLUMNS]


FIRST_STEP = "a session's first step"  # (its requests followed no pause of their session)


def request_tools(steps: pd.DataFrame, requests: pd.DataFrame) -> dict[str, str]:
    """request id -> the tool of the pause before its step, as `step_pauses` names it (`FIRST_STEP` for the requests
    of a session's first step): a session kind to group what a request found by."""
    if steps.empty or requests.empty:
        return {}
    ordered = steps.sort_values(["session_id", "step_index"], kind="stable").reset_index(drop=True)
    sent = step_requests(requests, ordered)
    tools = ordered["tools"] if "tools" in ordered else pd.Series(None, index=ordered.index)
    out: dict[str, str] = {}
    for i in range(len(ordered)):
        after_pause = i > 0 and ordered.at[i, "session_id"] == ordered.at[i - 1, "session_id"]
        tool = _tool(tools.iloc[i]) if after_pause else FIRST_STEP
        for request_id in sent[i]["request_id"]:
            out[str(request_id)] = tool
    return out


AFTER_LAST_STEP = "after the session's last step"  # (a block its session lost once it had no step to come)


def loss_tools(steps: pd.DataFrame, losses: pd.DataFrame) -> pd.Series:
    """Per loss row (`session_id`, `ts`; its index kept), the tool of the pause it fell in: that of the session's
    next step to start after it (as `request_tools` names a step's), `AFTER_LAST_STEP` past its last step, None
    where its session has no step."""
    out = pd.Series(None, index=losses.index, dtype=object)
    if steps.empty or losses.empty:
        return out
    tools = steps["tools"] if "tools" in steps else pd.Series(None, index=steps.index)
    by_session = {
        session: (group["started_at"].to_numpy(float), [_tool(t) for t in tools.loc[group.index]])
        for session, group in steps.sort_values("started_at", kind="stable").groupby("session_id", sort=False)
    }
    for index, session, ts in zip(losses.index, losses["session_id"], losses["ts"].astype(float)):
        found = by_session.get(session)
        if found is None:
            continue
        starts, names = found
        at = int(np.searchsorted(starts, ts, side="left"))
        out.at[index] = names[at] if at < len(names) else AFTER_LAST_STEP
    return out


def not_measured(frame: pd.DataFrame) -> int:
    """Steps after a pause whose usage did not say what was cached."""
    return int(frame["hit_rate"].isna().sum())


def pin_curve(frame: pd.DataFrame, ttls) -> pd.DataFrame:
    """Per TTL: the steps after a pause whose pause was at most it, and their share of all such steps and of their
    prompt tokens (`ttl_s`, `steps`, `step_share`, `token_share`)."""
    pauses = frame["pause_s"].to_numpy(float)
    tokens = frame["prompt_tokens"].fillna(0).to_numpy(float)
    rows = []
    for ttl in ttls:
        kept = pauses <= ttl
        rows.append(
            (
                float(ttl),
                int(kept.sum()),
                float(kept.mean()) if len(kept) else np.nan,
                float(tokens[kept].sum() / tokens.sum()) if tokens.sum() else np.nan,
            )
        )
    return pd.DataFrame(rows, columns=["ttl_s", "steps", "step_share", "token_share"])


def default_ttls(frame: pd.DataFrame, points: int = 12) -> list[float]:
    """TTLs from the shortest pause to the longest, evenly on a log scale (a pause of 0.2 s and one of 20 min
    both get a point)."""
    pauses = frame["pause_s"][frame["pause_s"] > 0]
    if pauses.empty:
        return []
    low, high = float(pauses.min()), float(pauses.max())
    return [float(t) for t in np.geomspace(low, high, num=points)] if high > low else [high]


def _tool(tools) -> str:
    if not isinstance(tools, str) or not tools:
        return NO_TOOL
    names = [str(call.get("name")) for call in json.loads(tools) if call.get("name")]
    return "+".join(dict.fromkeys(names)) or NO_TOOL
