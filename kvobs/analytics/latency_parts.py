"""Where a step's time went, and which part of it explains the excess over its session's typical step.

A step is measured by its TTFT (what the cache changes), else by its end-to-end time. Its parts come from its
request rows:
- measured by TTFT: its first request that got a first token: `queue_s` (arrival to scheduled), `prefill_s`
  (scheduled to first token), no decode;
- measured end to end: all its requests, summed: queue, prefill, `decode_s` (first token to finish);
- `other_s`, the rest of the latency: outside the engine's queue, prefill and decode (the client, the network, the
  server's tokenizing, the agent between its step's start and its request, a server the store does not hear from).

Inside the prefill (or the decode, for a preemption after the first token), what the KV record explains, in
seconds at the instance's measured prefill rate (`kvobs.analytics.prefill_rates`; unknown, NaN, without one):
- `lost_recompute_s`: recomputing the prefix the session lost in the tool pause before the step (its tokens, at
  most the request's uncached ones);
- `invalidated_recompute_s`: recomputing the session's blocks invalidated since its previous request;
- `routed_recompute_s`: recomputing the prefix another replica held at the request's lookup (a routing loss,
  `kvobs.analytics.routing`), in what the lost and invalidated tokens leave of the uncached ones;
- `preempted_s`: a preemption; before the first token, the prefill beyond what the request's uncached tokens need
  at that rate (the wait to be admitted again and the recompute); after it, recomputing the tokens it lost.

`explain_excess` weighs them: each part's excess over its typical value (the leave-one-out median of the
session's other steps, as for the latency itself); the prefill's excess (and the decode's) is split into the KV
estimates, scaled down to fit inside it, and the rest (more new tokens than usual). The slow cause is the part
with the largest excess, with its share of the step's whole excess: a step that queued 0.75 s and lost a prefix
worth 0.03 s of recompute was slow because of the queue.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

PARTS = ("queue_s", "prefill_s", "decode_s", "other_s")
ESTIMATES = ("lost_recompute_s", "invalidated_recompute_s", "routed_recompute_s", "preempted_s")
# part -> (cause, words): what each part of the excess is called
EXCESS_CAUSES = {
    "queue": ("queue_wait", "waiting in the queue"),
    "lost": ("prefix_evicted_in_pause", "recomputing the prefix lost in the tool pause"),
    "invalidated": ("invalidated", "recomputing invalidated blocks"),
    "routed": ("routed_away_from_prefix", "recomputing a prefix another replica held"),
    "preempted": ("preempted", "preemption (waiting again and recomputing)"),
    "prefill": ("long_prefill", "prefill of new prompt tokens"),
    "cold": ("cold_prefix", "prefill of a prompt with nothing cached"),
    "decode": ("long_decode", "decoding the reply"),
    "other": (
        "outside_server",
        "time before the engine had the request or after its first token (the client, "
        "the network, the server's tokenizing)",
    ),
}
# each slow cause in a few words, for tables, legends and the terminal (one definition)
CAUSE_LABELS = {
    "queue_wait": "waiting in the queue",
    "prefix_evicted_in_pause": "prefix lost in the tool pause",
    "invalidated": "cache invalidated",
    "routed_away_from_prefix": "prefix cached on another replica",
    "preempted": "preempted",
    "cold_prefix": "nothing cached (cold prefix)",
    "long_prefill": "more new prompt tokens than usual",
    "long_decode": "a longer reply than usual",
    "outside_server": "outside the engine (client, network, tokenizing)",
}


def server_parts(latency: float, by_ttft: bool, queue, arrival, first_token, finished) -> dict:
    """The parts of one step's latency from its requests' columns (arrays, in arrival order; a step sends one or a
    few, so plain floats, not numpy reductions)."""
    nan = float("nan")
    parts = {"queue_s": nan, "prefill_s": nan, "decode_s": 0.0, "measured": -1, "by_ttft": by_ttft}
    n = len(arrival)
    if n and by_ttft:
        got = next((i for i in range(n) if first_token[i] == first_token[i]), None)
        if got is not None:
            parts.update(
                queue_s=float(queue[got]), prefill_s=float(first_token[got] - arrival[got] - queue[got]), measured=got
            )
    elif n:
        queues = [float(q) for q in queue if q == q]
        prefill = [float(f - a - q) for f, a, q in zip(first_token, arrival, queue) if f == f and q == q]
        decode = [float(e - f) for e, f in zip(finished, first_token) if e == e and f == f]
        parts.update(queue_s=sum(queues) if queues else nan, prefill_s=sum(prefill), decode_s=sum(decode), measured=0)
    known = [parts[p] for p in ("queue_s", "prefill_s", "decode_s") if parts[p] == parts[p]]
    parts["other_s"] = latency - sum(known) if latency == latency else nan
    return parts


def kv_estimates(
    parts: dict,
    *,
    rate,
    uncached: float,
    lost_tokens: float,
    invalidated_tokens: float,
    routed_tokens: float = 0.0,
    preempted_before_first: bool,
    preempted_after_tokens: float,
) -> dict:
    """Seconds of the step's prefill (or decode) that the KV record explains, at the instance's measured prefill
    cost (`rate`, a `prefill_rates.Rate`; None: unknown, NaN wherever a fact needs it)."""
    if rate is None:
        nan = float("nan")
        return {
            "lost_recompute_s": nan if lost_tokens else 0.0,
            "invalidated_recompute_s": nan if invalidated_tokens else 0.0,
            "routed_recompute_s": nan if routed_tokens else 0.0,
            "preempted_s": nan if preempted_before_first or preempted_after_tokens else 0.0,
        }
    room = uncached if uncached == uncached else float("inf")  # cached tokens unknown: the lost ones bound it
    lost = min(lost_tokens, room)
    invalidated = min(invalidated_tokens, max(room - lost, 0.0))
    routed = min(routed_tokens, max(room - lost - invalidated, 0.0))
    preempted = 0.0
    if preempted_before_first and parts["prefill_s"] == parts["prefill_s"]:
        needed = rate.overhead_s + rate.seconds(uncached if uncached == uncached else lost + invalidated + routed)
        preempted = max(0.0, parts["prefill_s"] - needed)  # its prefill beyond one: the wait and the recompute
    preempted += rate.seconds(preempted_after_tokens)
    return {
        "lost_recompute_s": rate.seconds(lost),
        "invalidated_recompute_s": rate.seconds(invalidated),
        "routed_recompute_s": rate.seconds(routed),
        "preempted_s": preempted,
    }


def _split(excess: np.ndarray, estimates: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
    """The estimates' share of a positive excess (scaled down to fit inside it), and what is left of the excess."""
    known = np.all([~np.isnan(e) for e in estimates], axis=0) if estimates else np.ones(len(excess), bool)
    total = np.sum([np.nan_to_num(e) for e in estimates], axis=0) if estimates else np.zeros(len(excess))
    room = np.clip(np.nan_to_num(excess), 0.0, None)
    scale = np.where(total > room, np.divide(room, total, out=np.zeros_like(room), where=total > 0), 1.0)
    shares = [np.where(known, np.nan_to_num(e) * scale, np.nan) for e in estimates]
    rest = np.where(known, excess - np.nan_to_num(total) * scale, excess)
    return shares, rest


def explain_excess(frame: pd.DataFrame, typical: dict[str, np.ndarray]) -> pd.DataFrame:
    """Columns `excess_s`, `<part>_excess_s` and `dominant`, `dominant_s`, `dominant_share`: the part with the
    largest positive excess. `typical`: each latency part's (and `latency_s`') typical value per row."""
    latency = frame["latency_s"].to_numpy(float)
    excess = latency - typical["latency_s"]
    part_x = {p: frame[p].to_numpy(float) - typical[p] for p in PARTS}
    preempted = frame["preempted_s"].to_numpy(float)
    in_decode = frame["preempted_in_decode"].to_numpy(bool)
    before = np.where(in_decode, 0.0, preempted)
    (lost, invalidated, routed, pre_prefill), prefill_rest = _split(
        part_x["prefill_s"],
        [
            frame["lost_recompute_s"].to_numpy(float),
            frame["invalidated_recompute_s"].to_numpy(float),
            frame["routed_recompute_s"].to_numpy(float),
            before,
        ],
    )
    (pre_decode,), decode_rest = _split(part_x["decode_s"], [np.where(in_decode, preempted, 0.0)])
    cold = frame["cached_tokens"].fillna(-1).to_numpy(float) == 0
    candidates = {
        "queue": part_x["queue_s"],
        "lost": lost,
        "invalidated": invalidated,
        "routed": routed,
        "preempted": np.nan_to_num(pre_prefill) + np.nan_to_num(pre_decode),
        "prefill": np.where(cold, np.nan, prefill_rest),
        "cold": np.where(cold, prefill_rest, np.nan),
        "decode": decode_rest,
        "other": np.where(frame["num_requests"].to_numpy() > 0, part_x["other_s"], np.nan),
    }
    names = list(candidates)
    stacked = np.vstack([np.nan_to_num(candidates[n], nan=-np.inf) for n in names])
    best = stacked.argmax(axis=0)
    best_x = stacked[best, np.arange(len(frame))]
    out = frame.assign(excess_s=excess, **{f"{n}_excess_s": candidates[n] for n in names})
    found = best_x > 0
    out["dominant"] = pd.Series(
        np.where(found, np.array(names, dtype=object)[best], None), index=out.index, dtype=object
    )
    out["dominant_s"] = np.where(found, best_x, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        out["dominant_share"] = np.where(found & (excess > 0), best_x / excess, np.nan)
    return out


def excess_words(row, typical_s: float) -> str:
    """ "slow: waiting in the queue: 0.75 s of the 0.86 s over its typical 0.16 s (87%)"."""
    _, words = EXCESS_CAUSES[row["dominant"]]
    x, excess, share = row["dominant_s"], row["excess_s"], row["dominant_share"]
    if share == share and share <= 1.0:
        return f"slow: {words}: {x:.2f} s of the {excess:.2f} s over its typical {typical_s:.2f} s ({share:.0%})"
    return (
        f"slow: {words}: {x:.2f} s more than usual, more than the whole {excess:.2f} s over its typical "
        f"{typical_s:.2f} s (its other parts were quicker than usual)"
    )
