"""Why did an agent step fail, and why did it get slow? Two questions, answered apart, with the store's evidence.

    frame = attribute_steps(steps, requests, kv_events(store, kinds=ATTRIBUTION_KINDS))

A step's requests are those whose caller span is the step (`parent_span_id`), or, since the SDK's `chat` span sits
between them, those of the step's session (or trace) that arrived while the step ran. What the KV record shows about
a step (`causes`, checked in this order; `cause` is the first found):

- `invalidated`: the session's cached blocks were invalidated (or the whole cache cleared) between the session's
  previous request and the end of this step; evidence: the reasons.
- `prefix_evicted_in_pause`: blocks the session had cached were evicted while it was idle, between its previous
  request's end and this step's first request (the tool pause); evidence: blocks and tokens lost.
- `preempted`: a request of the step was preempted (recomputed); evidence: how often.
- `queue_wait`: a request waited at least `queue_wait_s` before being scheduled.
- `none`: nothing in the KV record explains it.

`slow_cause`: is the step slow against its own session's typical step (its TTFT, or end-to-end time when it got no
first token, above `slow_factor` x the median of the session's other steps, and at least `slow_min_s` above it;
a session with one step is measured against every step in the frame)? Then the first KV cause, else `cold_prefix`
when its requests found nothing cached, else `none` (slow for a reason the KV record does not show). A step that is
not slow has slow cause `none`, whatever the cache did.

`failure_cause` (failed steps only): the error itself for model, output, tool or request errors (`invalid_response`,
an HTTP status, a connection error): the cache does not make a model answer badly. Only a timeout is given a KV or
queue cause, when one is found (else `timeout`). `failure_kind` groups them: `cache`, `queue` (the KV cause of a
timeout), `timeout`, `model` (`invalid_response`), `request` (anything else).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection

import numpy as np
import pandas as pd

from kvobs.analytics.medians import leave_one_out_medians
from kvobs.semconv.spans import KVEventKind, StepErrorType, StepStatus

ATTRIBUTION_KINDS = tuple(k.value for k in (KVEventKind.EVICTED, KVEventKind.REMOVED, KVEventKind.INVALIDATED,
                                            KVEventKind.CLEARED, KVEventKind.PREEMPTED))  # fmt: skip
CAUSES = ("invalidated", "prefix_evicted_in_pause", "preempted", "queue_wait", "none")
SLOW_CAUSES = ("invalidated", "prefix_evicted_in_pause", "preempted", "queue_wait", "cold_prefix", "none")
FAILURE_KINDS = ("cache", "queue", "timeout", "model", "request")
MODEL_ERRORS = frozenset({StepErrorType.INVALID_RESPONSE.value})  # the model answered, but not as the agent needs
COLUMNS = ["session_id", "step_index", "status", "error_type", "started_at", "e2e_s", "ttft_s", "trace_id",
           "span_id", "cause", "causes", "evidence", "blocks_lost_in_pause", "tokens_lost_in_pause", "preemptions",
           "invalidation_reasons", "max_queue_s", "num_requests", "cached_tokens", "slow", "typical_s", "slow_cause",
           "failure_cause", "failure_kind"]  # fmt: skip
_EVICTION_KINDS = (KVEventKind.EVICTED.value, KVEventKind.REMOVED.value)


class _Requests:
    """Requests indexed for per-step lookup: by caller span, and by session and trace in arrival order."""

    def __init__(self, requests: pd.DataFrame) -> None:
        frame = self.frame = requests.sort_values("arrival_ts", kind="stable").reset_index(drop=True)
        self.arrival = frame["arrival_ts"].to_numpy(float)
        self.finished = frame["finished_ts"].to_numpy(float)
        self.queue = frame["queue_s"].to_numpy(float)
        self.preemptions = frame["num_preemptions"].fillna(0).to_numpy(float)
        self.cached = frame["cached_tokens"].to_numpy(float)
        self.request_id = frame["request_id"].to_numpy(object)
        self.by_span = _positions(frame["parent_span_id"])
        self.by_session = _positions(frame["session_id"])
        self.by_trace = _positions(frame["trace_id"])

    def of_step(self, step) -> np.ndarray:
        """Positions of the requests a step sent: by caller span, else by session or trace within the step's time."""
        direct = self.by_span.get(step.span_id)
        if direct is not None:
            return direct
        same = [self.by_session.get(step.session_id, _NONE), self.by_trace.get(step.trace_id, _NONE)]
        candidates = np.union1d(*same)
        ended = step.ended_at if pd.notna(step.ended_at) else np.inf
        arrival = self.arrival[candidates]
        return candidates[(arrival >= step.started_at) & (arrival <= ended)]


class _Events:
    """One session's KV events (or the instance-wide resets) in time order, sliced by (after, until] windows."""

    def __init__(self, events: pd.DataFrame) -> None:
        frame = events.sort_values("ts", kind="stable")
        self.ts = frame["ts"].to_numpy(float)
        self.kind = frame["kind"].to_numpy(object)
        self.block_hash = frame["block_hash"].to_numpy(object)
        self.num_tokens = frame["num_tokens"].to_numpy(float)
        self.reason = frame["reason"].to_numpy(object)

    def window(self, after: float, until: float) -> slice:
        return slice(*np.searchsorted(self.ts, [after, until], side="right"))


_NONE = np.empty(0, dtype=np.int64)


def _positions(column: pd.Series) -> dict:
    return {key: np.asarray(idx, dtype=np.int64) for key, idx in column.groupby(column, sort=False).indices.items()}


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _distinct_hashes(hashes) -> set:
    return {h for h in hashes if not _missing(h)}


def attribute_steps(
    steps: pd.DataFrame,
    requests: pd.DataFrame,
    events: pd.DataFrame,
    *,
    queue_wait_s: float = 1.0,
    slow_factor: float = 1.5,
    slow_min_s: float = 0.1,
    failed_only: bool = False,
    error_types: Collection[str] | None = None,
) -> pd.DataFrame:
    """One row per step (columns `COLUMNS`); `events` are KV events of `ATTRIBUTION_KINDS`. `failed_only`: rows of
    failed steps only (of `error_types`, when given), the others read just for what a failed step needs (its
    session's typical latency, the end of the step before it), which spares the KV analysis of every other step."""
    rows = []
    steps = steps.assign(wanted=attributed_mask(steps, error_types))
    reqs = _Requests(requests)
    empty = _Events(events.iloc[0:0])
    by_session = {sid: _Events(group) for sid, group in events.groupby("session_id")} if not events.empty else {}
    resets = _Events(events[events["kind"] == KVEventKind.CLEARED.value]) if not events.empty else empty
    preempted = Counter(events.loc[events["kind"] == KVEventKind.PREEMPTED.value, "request_id"]) if not events.empty \
        else Counter()  # fmt: skip
    in_order = steps.sort_values(["session_id", "step_index"], kind="stable").reset_index(drop=True)
    typical = _typical(in_order, _step_latency(in_order)).to_numpy(float)  # from every step, attributed or not
    if failed_only:
        typical = typical[in_order["wanted"].to_numpy(bool)]
    in_order = in_order.astype({c: object for c in in_order.columns if pd.api.types.is_string_dtype(in_order[c])})
    in_order = in_order.itertuples(index=False)  # from numpy objects: iterating Arrow strings costs ~1 us a value
    for session_id, session_steps in itertools.groupby(in_order, key=lambda step: step.session_id):
        session_events = by_session.get(session_id, empty)
        previous_end = None
        ordered = list(session_steps)
        wanted = [bool(step.wanted) for step in ordered] + [False]
        for i, step in enumerate(ordered):
            if failed_only and not wanted[i] and not wanted[i + 1]:
                continue  # neither attributed nor needed for where the next one's pause begins
            sent = reqs.of_step(step)
            if not failed_only or wanted[i]:
                rows.append(_attribute(step, reqs, sent, previous_end, session_events, resets, preempted,
                                       queue_wait_s))  # fmt: skip
            ends = reqs.finished[sent]
            ends = ends[~np.isnan(ends)]
            previous_end = ends.max() if len(ends) else (step.ended_at if pd.notna(step.ended_at) else None)
    frame = pd.DataFrame(rows, columns=COLUMNS).astype({"max_queue_s": float, "cached_tokens": float})
    return _verdicts(frame, typical, slow_factor, slow_min_s) if not frame.empty else frame


def attributed_mask(steps: pd.DataFrame, error_types: Collection[str] | None = None) -> pd.Series:
    """The steps `failed_only` attributes: failed ones, of `error_types` when given."""
    failed = steps["status"] == StepStatus.ERROR.value
    return failed & steps["error_type"].isin(list(error_types)) if error_types is not None else failed


def _step_latency(frame: pd.DataFrame) -> pd.Series:
    """What a step's slowness is measured by: its TTFT (what the cache changes), else its end-to-end time."""
    return frame["ttft_s"].astype(float).fillna(frame["e2e_s"].astype(float))


def _typical(frame: pd.DataFrame, latency: pd.Series) -> pd.Series:
    """Per step: the median latency of the session's other steps (every step's, for a session of one)."""
    overall = latency.median()
    typical = pd.Series(overall, index=frame.index, dtype=float)
    for _, index in frame.groupby("session_id").groups.items():
        if len(index) > 1:
            typical[index] = leave_one_out_medians(latency[index].to_numpy(dtype=float))
    return typical


def _verdicts(frame: pd.DataFrame, typical: np.ndarray, slow_factor: float, slow_min_s: float) -> pd.DataFrame:
    """`typical`: each row's typical latency (`_typical` over every step of its session, attributed or not)."""
    latency = _step_latency(frame).to_numpy(float)
    frame["typical_s"] = typical
    frame["slow"] = (latency > typical * slow_factor) & (latency - typical >= slow_min_s)
    cold = frame["cached_tokens"].fillna(0).eq(0) & frame["num_requests"].gt(0)
    cause = frame["cause"].to_numpy(object)
    slow_cause = np.where(cause == "none", np.where(cold.to_numpy(bool), "cold_prefix", "none"), cause)
    frame["slow_cause"] = np.where(frame["slow"].to_numpy(bool), slow_cause, "none").astype(object)
    failed = (frame["status"] == StepStatus.ERROR.value).to_numpy(bool)
    failure_cause, failure_kind = np.full(len(frame), None, dtype=object), np.full(len(frame), None, dtype=object)
    for i, error in zip(np.flatnonzero(failed), frame["error_type"].to_numpy(object)[failed]):
        failure_cause[i], failure_kind[i] = failure_verdict(error, cause[i])
    frame["failure_cause"], frame["failure_kind"] = failure_cause, failure_kind
    return frame


def failure_verdict(error_type, kv_cause: str) -> tuple[str, str]:
    """A failed step's cause and kind: only a timeout is blamed on the cache or the queue."""
    error = "unknown" if _missing(error_type) else str(error_type)
    if error == StepErrorType.TIMEOUT.value:
        if kv_cause == "none":
            return error, "timeout"
        return kv_cause, "queue" if kv_cause == "queue_wait" else "cache"
    return error, "model" if error in MODEL_ERRORS else "request"


def _attribute(step, reqs: _Requests, sent, previous_end, session_events: _Events, resets: _Events,
               preempted: Counter, queue_wait_s: float) -> dict:  # fmt: skip
    first_arrival = reqs.arrival[sent].min() if len(sent) else step.started_at
    step_end = step.ended_at if pd.notna(step.ended_at) else first_arrival
    causes, evidence = [], []

    reasons: list[str] = []
    if previous_end is not None:
        window = session_events.window(previous_end, step_end)
        invalidated = session_events.kind[window] == KVEventKind.INVALIDATED.value
        reset_reasons = resets.reason[resets.window(previous_end, step_end)]
        reasons = sorted({r for r in session_events.reason[window][invalidated] if not _missing(r)}
                         | {str(r) for r in reset_reasons if not _missing(r)})  # fmt: skip
        if invalidated.any() or len(reset_reasons):
            causes.append("invalidated")
            blocks = len(_distinct_hashes(session_events.block_hash[window][invalidated]))
            evidence.append(f"cache invalidated ({', '.join(reasons) or 'reset'}): {blocks} of its blocks")

    lost_blocks = lost_tokens = 0
    if previous_end is not None:
        pause = session_events.window(previous_end, first_arrival)
        evicted = np.isin(session_events.kind[pause], _EVICTION_KINDS)
        seen = set()
        for block_hash, tokens in zip(
            session_events.block_hash[pause][evicted], session_events.num_tokens[pause][evicted]
        ):
            key = None if _missing(block_hash) else block_hash
            if key not in seen:  # one count per block, however many rows (owners) recorded its loss
                seen.add(key)
                lost_tokens += 0 if np.isnan(tokens) else int(tokens)
        lost_blocks = len(seen - {None})
        if lost_blocks:
            causes.append("prefix_evicted_in_pause")
            evidence.append(f"{lost_blocks} cached blocks ({lost_tokens} tokens) evicted during the "
                            f"{first_arrival - previous_end:.2f} s pause before it")  # fmt: skip

    preemptions = int(reqs.preemptions[sent].sum())
    if preempted and len(sent):
        preemptions = max(preemptions, sum(preempted[rid] for rid in set(reqs.request_id[sent])))
    if preemptions:
        causes.append("preempted")
        evidence.append(f"preempted {preemptions} time{'s' if preemptions > 1 else ''} (recomputed)")

    queue = reqs.queue[sent]
    queue = queue[~np.isnan(queue)]
    max_queue = float(queue.max()) if len(queue) else None
    if max_queue is not None and max_queue >= queue_wait_s:
        causes.append("queue_wait")
        evidence.append(f"waited {max_queue:.2f} s in the queue")

    return {
        "session_id": step.session_id, "step_index": step.step_index, "status": step.status,
        "error_type": step.error_type, "started_at": step.started_at, "e2e_s": step.e2e_s, "ttft_s": step.ttft_s,
        "trace_id": step.trace_id, "span_id": step.span_id, "cause": causes[0] if causes else "none",
        "causes": ",".join(causes) or "none", "evidence": "; ".join(evidence),
        "blocks_lost_in_pause": lost_blocks, "tokens_lost_in_pause": lost_tokens, "preemptions": preemptions,
        "invalidation_reasons": ",".join(reasons), "max_queue_s": max_queue, "num_requests": len(sent),
        "cached_tokens": float(np.nansum(reqs.cached[sent])) if len(sent) else None,
    }  # fmt: skip


def step_requests(requests: pd.DataFrame, steps: pd.DataFrame) -> list[pd.DataFrame]:
    """For each row of `steps`, in order, the requests it sent (the attribution's own matching), by arrival."""
    index = _Requests(requests)
    return [index.frame.iloc[index.of_step(step)] for step in steps.itertuples(index=False)]


def failure_summary(attributed: pd.DataFrame) -> pd.DataFrame:
    """Failed steps per failure cause: `failure_kind`, `failure_cause`, `failed_steps`, `share` (of failed steps),
    most first; model errors stay model errors, only timeouts carry a KV or queue cause."""
    failed = attributed[attributed["status"] == StepStatus.ERROR.value]
    columns = ["failure_kind", "failure_cause", "failed_steps", "share"]
    if failed.empty:
        return pd.DataFrame(columns=columns)
    out = failed.groupby(["failure_kind", "failure_cause"]).size().rename("failed_steps").reset_index()
    out["share"] = out["failed_steps"] / len(failed)
    return out.sort_values(["failed_steps", "failure_cause"], ascending=[False, True]).reset_index(drop=True)[columns]


def failure_split(attributed: pd.DataFrame) -> dict[str, int]:
    """Failed steps by kind (`FAILURE_KINDS`): how many the cache or queue explains, how many are model errors."""
    failed = attributed[attributed["status"] == StepStatus.ERROR.value]
    counts = failed["failure_kind"].value_counts()
    return {kind: int(counts.get(kind, 0)) for kind in FAILURE_KINDS}
