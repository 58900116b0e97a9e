"""Why did an agent step fail or get slow? Per-step attribution with the evidence the store holds.

    frame = attribute_steps(steps, requests, kv_events(store, kinds=ATTRIBUTION_KINDS))

A step's requests are those whose caller span is the step (`parent_span_id`), or, since the SDK's `chat` span sits
between them, those of the step's session (or trace) that arrived while the step ran. The causes, checked in order,
the first found being the step's `cause`:

- `invalidated`: the session's cached blocks were invalidated (or the whole cache cleared) between the session's
  previous request and the end of this step; evidence: the reasons.
- `prefix_evicted_in_pause`: blocks the session had cached were evicted while it was idle, between its previous
  request's end and this step's first request (the tool pause); evidence: blocks and tokens lost.
- `preempted`: a request of the step was preempted (recomputed); evidence: how often.
- `queue_wait`: a request waited at least `queue_wait_s` before being scheduled.
- `none`: nothing in the KV record explains it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.semconv.spans import KVEventKind

ATTRIBUTION_KINDS = tuple(k.value for k in (KVEventKind.EVICTED, KVEventKind.REMOVED, KVEventKind.INVALIDATED,
                                            KVEventKind.CLEARED, KVEventKind.PREEMPTED))  # fmt: skip
CAUSES = ("invalidated", "prefix_evicted_in_pause", "preempted", "queue_wait", "none")
COLUMNS = ["session_id", "step_index", "status", "error_type", "started_at", "e2e_s", "ttft_s", "trace_id",
           "span_id", "cause", "causes", "evidence", "blocks_lost_in_pause", "tokens_lost_in_pause", "preemptions",
           "invalidation_reasons", "max_queue_s", "num_requests"]  # fmt: skip
_EVICTION_KINDS = (KVEventKind.EVICTED.value, KVEventKind.REMOVED.value)


def step_requests(step, requests: pd.DataFrame) -> pd.DataFrame:
    """The requests a step sent: by caller span, else by session or trace within the step's time."""
    if requests.empty:
        return requests
    direct = requests[requests["parent_span_id"] == step.span_id] if step.span_id else requests.iloc[0:0]
    if not direct.empty:
        return direct
    ended = step.ended_at if pd.notna(step.ended_at) else np.inf
    during = (requests["arrival_ts"] >= step.started_at) & (requests["arrival_ts"] <= ended)
    same = requests["session_id"] == step.session_id
    if step.trace_id:
        same |= requests["trace_id"] == step.trace_id
    return requests[during & same]


def attribute_steps(
    steps: pd.DataFrame, requests: pd.DataFrame, events: pd.DataFrame, *, queue_wait_s: float = 1.0
) -> pd.DataFrame:
    """One row per step (columns `COLUMNS`); `events` are KV events of `ATTRIBUTION_KINDS`."""
    rows = []
    by_session = {sid: group for sid, group in events.groupby("session_id")} if not events.empty else {}
    cleared = events[events["kind"] == KVEventKind.CLEARED.value] if not events.empty else events
    preempted = events[events["kind"] == KVEventKind.PREEMPTED.value] if not events.empty else events
    for session_id, session_steps in steps.sort_values(["session_id", "step_index"]).groupby("session_id"):
        session_events = by_session.get(session_id, events.iloc[0:0])
        previous_end = None
        for step in session_steps.itertuples(index=False):
            reqs = step_requests(step, requests)
            rows.append(_attribute(step, reqs, previous_end, session_events, cleared, preempted, queue_wait_s))
            ends = reqs["finished_ts"].dropna()
            previous_end = ends.max() if not ends.empty else (step.ended_at if pd.notna(step.ended_at) else None)
    return pd.DataFrame(rows, columns=COLUMNS)


def _attribute(step, reqs, previous_end, session_events, cleared, preempted, queue_wait_s) -> dict:
    first_arrival = reqs["arrival_ts"].min() if not reqs.empty else step.started_at
    step_end = step.ended_at if pd.notna(step.ended_at) else first_arrival
    causes, evidence = [], []

    reasons: list[str] = []
    if previous_end is not None:
        window = (session_events["ts"] > previous_end) & (session_events["ts"] <= step_end)
        invalidated = session_events[window & (session_events["kind"] == KVEventKind.INVALIDATED.value)]
        resets = cleared[(cleared["ts"] > previous_end) & (cleared["ts"] <= step_end)]
        reasons = sorted(set(invalidated["reason"].dropna()) | set(resets["reason"].dropna().map(str)))
        if not invalidated.empty or not resets.empty:
            causes.append("invalidated")
            evidence.append(f"cache invalidated ({', '.join(reasons) or 'reset'}): "
                            f"{invalidated['block_hash'].nunique()} of its blocks")  # fmt: skip

    lost_blocks = lost_tokens = 0
    if previous_end is not None:
        pause = (session_events["ts"] > previous_end) & (session_events["ts"] <= first_arrival)
        lost = session_events[pause & session_events["kind"].isin(_EVICTION_KINDS)]
        lost_blocks = int(lost["block_hash"].nunique())
        lost_tokens = int(lost.drop_duplicates("block_hash")["num_tokens"].fillna(0).sum())
        if lost_blocks:
            causes.append("prefix_evicted_in_pause")
            evidence.append(f"{lost_blocks} cached blocks ({lost_tokens} tokens) evicted during the "
                            f"{first_arrival - previous_end:.2f} s pause before it")  # fmt: skip

    preemptions = int(reqs["num_preemptions"].fillna(0).sum()) if not reqs.empty else 0
    if not preempted.empty and not reqs.empty:
        preemptions = max(preemptions, int(preempted["request_id"].isin(reqs["request_id"]).sum()))
    if preemptions:
        causes.append("preempted")
        evidence.append(f"preempted {preemptions} time{'s' if preemptions > 1 else ''} (recomputed)")

    max_queue = float(reqs["queue_s"].max()) if not reqs.empty and reqs["queue_s"].notna().any() else None
    if max_queue is not None and max_queue >= queue_wait_s:
        causes.append("queue_wait")
        evidence.append(f"waited {max_queue:.2f} s in the queue")

    return {
        "session_id": step.session_id, "step_index": step.step_index, "status": step.status,
        "error_type": step.error_type, "started_at": step.started_at, "e2e_s": step.e2e_s, "ttft_s": step.ttft_s,
        "trace_id": step.trace_id, "span_id": step.span_id, "cause": causes[0] if causes else "none",
        "causes": ",".join(causes) or "none", "evidence": "; ".join(evidence),
        "blocks_lost_in_pause": lost_blocks, "tokens_lost_in_pause": lost_tokens, "preemptions": preemptions,
        "invalidation_reasons": ",".join(reasons), "max_queue_s": max_queue, "num_requests": len(reqs),
    }  # fmt: skip


def failure_summary(attributed: pd.DataFrame) -> pd.DataFrame:
    """Failed steps per cause: `cause`, `failed_steps`, `share`."""
    failed = attributed[attributed["status"] == "error"]
    counts = failed["cause"].value_counts().reindex(list(CAUSES), fill_value=0)
    out = counts.rename("failed_steps").rename_axis("cause").reset_index()
    out["share"] = out["failed_steps"] / max(len(failed), 1)
    return out
