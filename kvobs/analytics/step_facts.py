"""What the KV record shows about one agent step, with what each fact cost: the step's facts (`causes`, the
evidence) and the seconds the KV record explains, for `kvobs.analytics.attribution`.

The facts, each looked up in the step's session's KV events:
- `invalidated`: its cached blocks invalidated (or the whole cache reset) between its previous request and its end;
- `prefix_evicted_in_pause`: blocks it had cached evicted while it was idle, between its previous request's end and
  this step's first request (the tool pause);
- `routed_away_from_prefix`: its request recomputed a prefix another replica of the fleet held at its lookup
  (`kvobs.analytics.routing`: the replica, its blocks, the tokens);
- `preempted`: a request of the step preempted (recomputed);
- `queue_wait`: a request waited at least `queue_wait_s` before being scheduled.
Their cost in seconds comes from `kvobs.analytics.latency_parts.kv_estimates` at the instance's measured prefill rate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvobs.analytics.latency_parts import PARTS, kv_estimates
from kvobs.analytics.prefill_rates import MIN_RATE_REQUESTS, PrefillRates
from kvobs.semconv.spans import KVEventKind

EVICTION_KINDS = (KVEventKind.EVICTED.value, KVEventKind.REMOVED.value)


def positions_by_value(values: np.ndarray) -> dict:
    """Value -> the positions holding it, ascending (missing values left out): one factorize and one stable sort, not
    a groupby (whose per-value lookups of Arrow strings cost 1 us each, and a DataFrame per group 0.7 ms)."""
    codes, found = pd.factorize(values)
    order = np.argsort(codes, kind="stable").astype(np.int64)  # rows of no value (code -1) first, then left out
    bounds = np.searchsorted(codes[order], np.arange(len(found) + 1))
    return {value: order[bounds[i] : bounds[i + 1]] for i, value in enumerate(found.tolist())}


class Events:
    """One session's KV events (or the instance-wide resets) in time order, sliced by (after, until] windows."""

    COLUMNS = ("ts", "kind", "block_hash", "num_tokens", "reason")

    def __init__(self, events: pd.DataFrame) -> None:
        self._take(events.sort_values("ts", kind="stable"))

    def _take(self, frame: pd.DataFrame) -> None:
        """The columns of `frame`, already in time order."""
        self.ts = frame["ts"].to_numpy(float)
        self.kind = frame["kind"].to_numpy(object)
        self.block_hash = frame["block_hash"].to_numpy(object)
        self.num_tokens = frame["num_tokens"].to_numpy(float)
        self.reason = frame["reason"].to_numpy(object)

    @classmethod
    def by_session(cls, events: pd.DataFrame) -> dict:
        """Session id -> that session's `Events`: one sort of every row by time, and a slice of each column per
        session (`positions_by_value`)."""
        ordered = events.sort_values("ts", kind="stable")
        whole = cls.__new__(cls)
        whole._take(ordered)
        return {
            session_id: whole._rows(rows)
            for session_id, rows in positions_by_value(ordered["session_id"].to_numpy(object)).items()
        }

    def _rows(self, rows: np.ndarray) -> Events:
        """These positions' events, in the same order."""
        part = Events.__new__(Events)
        for column in self.COLUMNS:
            setattr(part, column, getattr(self, column)[rows])
        return part

    def window(self, after: float, until: float) -> slice:
        return slice(*np.searchsorted(self.ts, [after, until], side="right"))


def missing(value) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def step_facts(
    step,
    latency: float,
    parts: dict,
    reqs,
    sent,
    previous_end,
    session_events: Events,
    resets: Events,
    preempted: dict,
    rates: PrefillRates,
    queue_wait_s: float,
    routed: dict | None = None,
) -> dict:
    """One attributed step's row: its facts (`causes`, `facts`: the evidence, each with what it cost), its latency
    parts (`parts`, `latency_parts.server_parts`) and the KV estimates. `sent`: its requests' positions in `reqs`
    (the attribution's `_Requests`); `previous_end`: when the session's previous step's requests ended (None for
    its first step); `preempted`: request id -> (ts, tokens lost) of each preemption; `routed`: request id -> its
    `routing.routing_losses` row, for requests with a routing loss."""
    first_arrival = reqs.arrival[sent].min() if len(sent) else step.started_at
    step_end = step.ended_at if not missing(step.ended_at) else first_arrival
    measured = sent[parts["measured"]] if parts["measured"] >= 0 else None
    instance = reqs.instance[measured] if measured is not None else None
    rate = rates.at(instance, reqs.arrival[measured]) if measured is not None else None
    causes, facts = [], []

    def cost(seconds: float, tokens: float) -> str:
        if not tokens:
            return ""
        if rate is None:
            return (
                f", recompute time unknown (no measured prefill rate: fewer than {MIN_RATE_REQUESTS} requests on "
                f"{instance or 'its instance'} in the minutes before)"
            )
        return f", about {seconds:.2f} s to recompute at {rate.describe(instance or 'its instance')}"

    reasons: list[str] = []
    invalidated_tokens = 0.0
    if previous_end is not None:
        window = session_events.window(previous_end, step_end)
        invalidated = session_events.kind[window] == KVEventKind.INVALIDATED.value
        reset_reasons = resets.reason[resets.window(previous_end, step_end)]
        reasons = sorted(
            {r for r in session_events.reason[window][invalidated] if not missing(r)}
            | {str(r) for r in reset_reasons if not missing(r)}
        )
        if invalidated.any() or len(reset_reasons):
            blocks, invalidated_tokens = _distinct(
                session_events.block_hash[window][invalidated], session_events.num_tokens[window][invalidated]
            )
            causes.append("invalidated")
            facts.append(f"cache invalidated ({', '.join(reasons) or 'reset'}): {blocks} of its blocks{{invalidated}}")

    lost_blocks = lost_tokens = 0
    if previous_end is not None:
        pause = session_events.window(previous_end, first_arrival)
        evicted = np.isin(session_events.kind[pause], EVICTION_KINDS)
        lost_blocks, lost_tokens = _distinct(
            session_events.block_hash[pause][evicted], session_events.num_tokens[pause][evicted]
        )
        if lost_blocks:
            causes.append("prefix_evicted_in_pause")
            facts.append(
                f"{lost_blocks} cached blocks ({lost_tokens} tokens) evicted during the "
                f"{first_arrival - previous_end:.2f} s pause before it{{lost}}"
            )

    loss = _routing_loss(reqs, sent, measured, routed or {})
    routed_tokens = 0 if loss is None else loss["routed_tokens"]
    if loss is not None:
        causes.append("routed_away_from_prefix")
        facts.append(
            f"routed to {loss['instance']}, which had {loss['own_blocks']} of its prefix's blocks cached, while "
            f"{loss['best_instance']} held {loss['best_blocks']}: {routed_tokens} tokens recomputed that "
            f"{loss['best_instance']} had cached{{routed}}"
        )

    preemptions = int(reqs.preemptions[sent].sum())
    own_preemptions = [p for rid in dict.fromkeys(reqs.request_id[sent]) for p in preempted.get(rid, ())]
    preemptions = max(preemptions, len(own_preemptions))
    first_token = reqs.first_token[measured] if measured is not None else np.nan
    before = any(not ts > first_token for ts, _ in own_preemptions)  # before the first token, or it never came
    after_tokens = 0.0 if parts["by_ttft"] else sum(tokens for ts, tokens in own_preemptions if ts > first_token)
    if preemptions:
        causes.append("preempted")
        facts.append(f"preempted {preemptions} time{'s' if preemptions > 1 else ''} (recomputed){{preempted}}")

    queue = reqs.queue[sent]
    queue = queue[~np.isnan(queue)]
    max_queue = float(queue.max()) if len(queue) else None
    if max_queue is not None and max_queue >= queue_wait_s:
        causes.append("queue_wait")
        facts.append(f"waited {max_queue:.2f} s in the queue")

    uncached = reqs.prompt[measured] - reqs.cached[measured] if measured is not None else np.nan
    estimates = kv_estimates(
        parts,
        rate=rate,
        uncached=uncached,
        lost_tokens=lost_tokens,
        invalidated_tokens=invalidated_tokens,
        routed_tokens=routed_tokens,
        preempted_before_first=before and bool(own_preemptions),
        preempted_after_tokens=after_tokens,
    )
    words = {
        "lost": cost(estimates["lost_recompute_s"], lost_tokens),
        "invalidated": cost(estimates["invalidated_recompute_s"], invalidated_tokens),
        "routed": cost(estimates["routed_recompute_s"], routed_tokens),
        "preempted": ""
        if not own_preemptions or rate is None or not estimates["preempted_s"]
        else f", about {estimates['preempted_s']:.2f} s of its latency",
    }
    facts = [fact.format(**words) for fact in facts]
    return {
        "session_id": step.session_id,
        "step_index": step.step_index,
        "status": step.status,
        "error_type": step.error_type,
        "started_at": step.started_at,
        "e2e_s": step.e2e_s,
        "ttft_s": step.ttft_s,
        "trace_id": step.trace_id,
        "span_id": step.span_id,
        "response_id": getattr(step, "response_id", None),
        "causes": ",".join(causes) or "none",
        "facts": facts,
        "blocks_lost_in_pause": lost_blocks,
        "tokens_lost_in_pause": lost_tokens,
        "instance": instance if instance is not None else (reqs.instance[sent[0]] if len(sent) else None),
        "routed_tokens": routed_tokens,
        "routed_from": None if loss is None else loss["best_instance"],
        "preemptions": preemptions,
        "invalidation_reasons": ",".join(reasons),
        "max_queue_s": max_queue,
        "num_requests": len(sent),
        "cached_tokens": float(np.nansum(reqs.cached[sent])) if (~np.isnan(reqs.cached[sent])).any() else None,
        "latency_s": latency,
        **{p: parts[p] for p in PARTS},
        **estimates,
        "preempted_in_decode": bool(own_preemptions) and not before,
        "prefill_rate": np.nan if rate is None else rate.tokens_per_s,
    }


def _routing_loss(reqs, sent, measured, routed: dict) -> dict | None:
    """The routing loss of the request the step is measured by (else the largest of its requests'), if any."""
    if not routed or not len(sent):
        return None
    if measured is not None and reqs.request_id[measured] in routed:
        return routed[reqs.request_id[measured]]
    found = [routed[rid] for rid in reqs.request_id[sent] if rid in routed]
    return max(found, key=lambda row: row["routed_tokens"]) if found else None


def _distinct(hashes, tokens) -> tuple[int, int]:
    """Blocks and their tokens, each block once however many rows (owners) recorded its loss."""
    seen, total = set(), 0
    for block_hash, n in zip(hashes, tokens):
        key = None if missing(block_hash) else block_hash
        if key not in seen:
            seen.add(key)
            total += 0 if np.isnan(n) else int(n)
    return len(seen - {None}), total
