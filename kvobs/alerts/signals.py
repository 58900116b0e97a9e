"""The values alert rules compare: each a function of the store over a window `[until - window, until]`.

A signal returns `(instance, session_id, value)` triples, one per thing it watches (an instance, a session, or
the whole fleet with both None). Windows without data return nothing, so a quiet system never fires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvobs.analytics.cache import FLEET, fleet_losses, hit_rates_in, routing_summary, routing_summary_of_sums
from kvobs.analytics.steps import cost_kind
from kvobs.analytics.windows import lookup_range_sums
from kvobs.store.interface import Store
from kvobs.store.rollups import PREEMPTIONS, preemption_increase

Value = tuple[str | None, str | None, float]


@dataclass(frozen=True)
class Signal:
    fn: Callable[..., list[Value]]
    params: tuple[str, ...] = ()
    description: str = ""


def kv_usage(store: Store, since: float, until: float) -> list[Value]:
    snaps = store.reads.instance_snapshots(since, until).dropna(subset=["kv_usage"])
    return [(inst, None, float(v)) for inst, v in snaps.groupby("instance")["kv_usage"].mean().items()]


def preemptions_per_min(store: Store, since: float, until: float) -> list[Value]:
    before = store.lookups.instance_counter_before(PREEMPTIONS, since)
    snaps = store.reads.instance_snapshots(since, until).dropna(subset=[PREEMPTIONS])
    totals = preemption_increase(snaps, before).groupby(snaps["instance"]).sum()
    return [(inst, None, float(total) * 60.0 / (until - since)) for inst, total in totals.items()]


def _hit_rates(store: Store, since: float, until: float) -> dict[str, float]:
    return {inst: hit.rate for inst, hit in hit_rates_in(store, since, until).items() if hit.rate is not None}


def hit_rate(
    store: Store, since: float, until: float, baseline_window_s: float | None = None, baseline_min: float = 0.0
) -> list[Value]:
    """Per instance: the prefix-cache hit rate of the requests that arrived in the window (the one hit rate,
    `kvobs.analytics.cache.hit_rate`: cached / prompt tokens, else vLLM's counters); with `baseline_window_s`, only
    instances whose hit rate over that long before the window was at least `baseline_min` (a collapse needs a level
    to fall from)."""
    now = _hit_rates(store, since, until)
    if baseline_window_s is not None:
        before = _hit_rates(store, since - baseline_window_s, since)
        now = {inst: v for inst, v in now.items() if before.get(inst, -1.0) >= baseline_min}
    return [(inst, None, v) for inst, v in now.items()]


def median_block_lifetime_s(store: Store, since: float, until: float) -> list[Value]:
    """Per instance: the median time from a block's `stored` to its loss, over the blocks lost in the window whose
    store is known (vLLM's `vllm:kv_block_lifetime_seconds`, from `kv_events.lifetime_s`, known at ingest)."""
    lives = store.lookups.block_lifetimes(since, until)
    return [(inst, None, float(g["lifetime_s"].median())) for inst, g in lives.groupby("instance")]


def eviction_churn(store: Store, since: float, until: float) -> list[Value]:
    """Per instance: the share of blocks stored in the window that brought back a block lost on that instance and
    tier (`kv_events.restored`, known at ingest; rows written before revision 0021 do not count either way)."""
    frame = store.lookups.restored_blocks(since, until)
    return [(r.instance, None, float(r.restored or 0) / r.stored) for r in frame.itertuples() if r.stored]


def prefix_lost_in_pause_per_min(store: Store, since: float, until: float) -> list[Value]:
    """Per instance: cached blocks sessions lost in tool pauses, per minute of the window.

    Only settled losses count (`session_evicted_idle_blocks`: the session came back after the loss); losses still
    pending, after a session's end, or during a request never do. Each session's increase inside the window is
    its latest count in the window minus its latest before it.
    """
    frame = store.lookups.session_idle_losses(until).dropna(subset=["session_id", "instance"])
    keys, count = ["session_id", "instance"], "session_evicted_idle_blocks"
    frame = frame.sort_values("ts", kind="stable")
    inside = frame[frame["ts"] >= since]
    if inside.empty:
        return []
    # (one pass per window, not per session: a store of a thousand sessions read group by group took a second)
    latest = inside.groupby(keys)[count].max()
    before = frame[frame["ts"] < since].groupby(keys).tail(1).set_index(keys)[count]
    lost = latest - before.reindex(latest.index, fill_value=0)  # (a session with no count before it: from 0)
    lost = lost[lost > 0]
    minutes = max(until - since, 1e-9) / 60.0
    per_instance = lost.groupby(level="instance").sum()
    return [(str(instance), None, float(n) / minutes) for instance, n in sorted(per_instance.items())]


def routing_loss_share(store: Store, since: float, until: float, min_requests: int = 5) -> list[Value]:
    """Per instance: prompt tokens its requests recomputed while another replica of the fleet held that prefix, over
    the prompt tokens of its requests compared (`kvobs.analytics.cache.routing`), where at least `min_requests` were;
    nothing on a single instance. Read from the lookups a collector measured (the writer's per-minute rollup: the
    same cost whatever the window) where it measured any in the window; replayed from the window's KV events only on
    a store no collector measures."""
    sums = lookup_range_sums(store, since, until)
    if not sums.empty:
        summary = routing_summary_of_sums(sums, since, until)
    else:
        requests = store.reads.requests(since, until)
        losses, _ = fleet_losses(store, requests, store.reads.steps(since, until), since, until)
        if losses.empty:
            return []
        summary = routing_summary(losses, since, until)
    summary = summary[(summary["instance"] != FLEET) & (summary["requests"] >= min_requests)]
    return [(r.instance, None, float(r.routed_share)) for r in summary.itertuples() if r.prompt_tokens]


def step_failure_rate(
    store: Store, since: float, until: float, min_steps: int = 5, exclude_errors: tuple[str, ...] = ()
) -> list[Value]:
    """Failed agent steps / steps started in the window (at least `min_steps`), failures of `exclude_errors` not
    counted as failures (the model's output errors: the cache does not cause them)."""
    total, failed = store.lookups.step_counts(since, until, exclude_errors=tuple(exclude_errors))
    if not total or total < min_steps:
        return []
    return [(None, None, failed / total)]


def cache_cost_share(store: Store, since: float, until: float, min_steps: int = 10) -> list[Value]:
    """Of the agent steps whose verdict the collector decided in the window (their sessions settled: a step still
    pending is not counted), the share the KV cache cost: failed or slow by a cause of kind `cache` (a prefix lost in
    a tool pause, invalidated or routed away, a preemption; `verdicts.cost_kind`), of at least `min_steps`."""
    decided = store.reads.step_verdicts(since, until, decided_in=True)
    decided = decided[decided["slow"].notna()]  # (a row decided before every step was: no slow verdict to weigh)
    if len(decided) < max(min_steps, 1):
        return []
    kinds = [cost_kind(*row) for row in decided[["failure_kind", "slow", "slow_cause"]].itertuples(index=False)]
    return [(None, None, sum(kind == "cache" for kind in kinds) / len(kinds))]


def _burn(store: Store, since: float, until: float, slo_s: float, objective: float) -> dict[str, float]:
    reqs = store.reads.requests(since, until).dropna(subset=["ttft_s"])
    budget = max(1.0 - objective, 1e-9)
    return {inst: float((group["ttft_s"] > slo_s).mean()) / budget for inst, group in reqs.groupby("instance")}


def ttft_slo_burn(
    store: Store,
    since: float,
    until: float,
    slo_s: float = 2.5,
    objective: float = 0.99,
    short_window_s: float | None = None,
) -> list[Value]:
    """Per instance: the share of requests whose TTFT missed `slo_s`, over the error budget `1 - objective`; with
    `short_window_s`, the lower of the window's burn and the last `short_window_s`'s (a multi-window burn-rate
    alert: both must burn)."""
    burn = _burn(store, since, until, slo_s, objective)
    if short_window_s is not None:
        short = _burn(store, until - short_window_s, until, slo_s, objective)
        burn = {inst: min(v, short[inst]) for inst, v in burn.items() if inst in short}
    return [(inst, None, v) for inst, v in burn.items()]


def instance_up(store: Store, since: float, until: float) -> list[Value]:
    """Per scraped instance: its latest `up` sample in the window (1 answered, 0 did not)."""
    samples = store.reads.metric_series(["up"], since, until)
    return [(inst, None, float(g["value"].iloc[-1])) for inst, g in samples.groupby("instance")]


SIGNALS: dict[str, Signal] = {
    "kv_usage": Signal(kv_usage, (), "mean pinned KV usage per instance"),
    "preemptions_per_min": Signal(preemptions_per_min, (), "preemptions per minute per instance"),
    "hit_rate": Signal(
        hit_rate, ("baseline_window_s", "baseline_min"), "prefix-cache hit rate per instance (cached / prompt tokens)"
    ),
    "median_block_lifetime_s": Signal(median_block_lifetime_s, (), "median lifetime of blocks lost, per instance"),
    "eviction_churn": Signal(eviction_churn, (), "share of stored blocks that brought back a block lost there"),
    "prefix_lost_in_pause_per_min": Signal(
        prefix_lost_in_pause_per_min, (), "blocks sessions lost in tool pauses (settled) per minute, per instance"
    ),
    "routing_loss_share": Signal(
        routing_loss_share,
        ("min_requests",),
        "prompt tokens recomputed while another replica held them / prompt tokens compared, per instance",
    ),
    "step_failure_rate": Signal(step_failure_rate, ("min_steps", "exclude_errors"), "failed agent steps / steps"),
    "cache_cost_share": Signal(cache_cost_share, ("min_steps",), "steps decided that the KV cache failed or slowed"),
    "ttft_slo_burn": Signal(ttft_slo_burn, ("slo_s", "objective", "short_window_s"), "TTFT SLO error-budget burn"),
    "instance_up": Signal(instance_up, (), "latest `up` scrape sample per instance"),
}
