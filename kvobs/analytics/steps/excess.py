"""Which part of a step's latency explains its excess over its session's typical step (`explain_excess`), what each
part is called as a cause, and what kind of failure it makes of a timeout.

Each part of `kvobs.analytics.steps.latency_parts` is weighed against its typical value (the session's other steps): the
part with the largest excess is the slow cause, and the cause of a timeout. The decode's excess is split by the
session's typical time per output token into a slower decode and a longer reply.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# candidate -> (cause, words): what each part of the excess is called
EXCESS_CAUSES = {
    "queue": ("queue_wait", "waiting in the queue"),
    "preempted": ("preempted", "preemption (waiting to be re-admitted and recomputing)"),
    "lost": ("prefix_evicted_in_pause", "recomputing the prefix lost in the tool pause"),
    "invalidated": ("invalidated", "recomputing invalidated blocks"),
    "routed": ("routed_away_from_prefix", "recomputing a prefix another replica held"),
    "prefill": ("long_prefill", "prefill of new prompt tokens"),
    "cold": ("cold_prefix", "prefill of a prompt with nothing cached"),
    "slow_decode": ("slow_decode", "decoding slower per token than usual"),
    "decode": ("long_decode", "decoding a longer reply than usual"),
    "tool": ("tool_calls", "the step's own tool calls"),
    "before": (
        "before_server",
        "the time before its request reached the server (the agent's own queue, the network, the server's accept "
        "queue, and whatever the server does before it stamps the arrival)",
    ),
    "other": (
        "outside_server",
        "time outside the engine once its request had reached the server (the reply's way back, the agent's own work "
        "between its requests)",
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
    "slow_decode": "decoding slower than usual",
    "long_decode": "a longer reply than usual",
    "tool_calls": "its own tool calls",
    "before_server": "before reaching the server (agent queue, network, accept queue)",
    "outside_server": "outside the engine (the reply's way back, the agent's work)",
    "never_reached_server": "its request never reached the server",
}
# what kind of failure a timeout is, by the part that cost it
FAILURE_KIND_OF = {
    "queue_wait": "queue",
    "preempted": "cache",
    "prefix_evicted_in_pause": "cache",
    "invalidated": "cache",
    "routed_away_from_prefix": "cache",
    "cold_prefix": "engine",
    "long_prefill": "engine",
    "slow_decode": "engine",
    "long_decode": "engine",
    "tool_calls": "tool",
    "before_server": "outside",
    "outside_server": "outside",
    "never_reached_server": "outside",
}


def explain_excess(frame: pd.DataFrame, typical: dict[str, np.ndarray]) -> pd.DataFrame:
    """Columns `excess_s`, `<candidate>_excess_s` and `dominant`, `dominant_s`, `dominant_share`: the candidate
    (`EXCESS_CAUSES`) with the largest positive excess over its typical value. `typical`: per row, each part's
    (`PARTS`, `ESTIMATES`, `new_prefill_s`), `latency_s`' and `tpot_s`' (seconds per decoded token)."""
    latency = frame["latency_s"].to_numpy(float)
    excess = latency - typical["latency_s"]

    def over(column: str) -> np.ndarray:
        return frame[column].to_numpy(float) - np.nan_to_num(typical[column])

    new_prefill = over("new_prefill_s")
    cold = frame["cached_tokens"].fillna(-1).to_numpy(float) == 0
    decode, tokens = frame["decode_s"].to_numpy(float), frame["decoded_tokens"].to_numpy(float)
    at_usual_pace = np.nan_to_num(typical["tpot_s"]) * tokens
    known_pace = ~np.isnan(typical["tpot_s"]) & (tokens > 0)
    candidates = {
        "queue": over("queue_s"),
        "preempted": over("preempted_s"),
        "lost": over("lost_recompute_s"),
        "invalidated": over("invalidated_recompute_s"),
        "routed": over("routed_recompute_s"),
        "prefill": np.where(cold, np.nan, new_prefill),
        "cold": np.where(cold, new_prefill, np.nan),
        "slow_decode": np.where(known_pace, decode - at_usual_pace, np.nan),
        "decode": np.where(known_pace, at_usual_pace - np.nan_to_num(typical["decode_s"]), over("decode_s")),
        "tool": over("tool_s"),
        "before": over("before_s"),
        "other": over("other_s"),
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


def largest_part(row) -> str | None:
    """The candidate holding the most seconds of a step (a timeout whose parts are all as usual: where its time
    went), None when the step has no measured part."""
    values = {
        "queue": row["queue_s"],
        "preempted": row["preempted_s"],
        "lost": row["lost_recompute_s"],
        "invalidated": row["invalidated_recompute_s"],
        "routed": row["routed_recompute_s"],
        "cold" if row["cached_tokens"] == 0 else "prefill": row["new_prefill_s"],
        "decode": row["decode_s"],
        "tool": row["tool_s"],
        "before": row["before_s"],
        "other": row["other_s"],
    }
    values = {k: float(v) for k, v in values.items() if v == v and v > 0}
    return max(values, key=lambda k: values[k]) if values else None


def part_seconds(row, candidate: str) -> float:
    """The seconds of a step a candidate names (the decode's two candidates share the decode)."""
    column = {
        "queue": "queue_s",
        "preempted": "preempted_s",
        "lost": "lost_recompute_s",
        "invalidated": "invalidated_recompute_s",
        "routed": "routed_recompute_s",
        "prefill": "new_prefill_s",
        "cold": "new_prefill_s",
        "slow_decode": "decode_s",
        "decode": "decode_s",
        "tool": "tool_s",
        "before": "before_s",
        "other": "other_s",
    }[candidate]
    return float(row[column])


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
