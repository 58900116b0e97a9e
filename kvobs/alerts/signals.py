"""The values alert rules compare: each a function of the store over a window `[until - window, until]`.

A signal returns `(instance, session_id, value)` triples, one per thing it watches (an instance, a session, or
the whole fleet with both None). Windows without data return nothing, so a quiet system never fires.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvobs.analytics.pressure import preemption_increase
from kvobs.store import queries
from kvobs.store.db import Store

Value = tuple[str | None, str | None, float]


@dataclass(frozen=True)
class Signal:
    fn: Callable[..., list[Value]]
    params: tuple[str, ...] = ()
    description: str = ""


def kv_usage(store: Store, since: float, until: float) -> list[Value]:
    snaps = queries.instance_snapshots(store, since, until).dropna(subset=["kv_usage"])
    return [(inst, None, float(v)) for inst, v in snaps.groupby("instance")["kv_usage"].mean().items()]


def preemptions_per_min(store: Store, since: float, until: float) -> list[Value]:
    before = queries.instance_counter_before(store, "preemptions_total", since)
    snaps = queries.instance_snapshots(store, since, until).dropna(subset=["preemptions_total"])
    snaps = snaps.assign(delta=preemption_increase(snaps))
    out = []
    for inst, group in snaps.groupby("instance"):
        first = group.iloc[0]
        base = before.get(inst)
        head = 0.0 if base is None else max(first["preemptions_total"] - base, 0)  # reset: counted from the next
        total = head + group["delta"].iloc[1:].sum()
        out.append((inst, None, float(total) * 60.0 / (until - since)))
    return out


def hit_rate(store: Store, since: float, until: float) -> list[Value]:
    snaps = queries.instance_snapshots(store, since, until).dropna(subset=["hit_rate"])
    return [(inst, None, float(v)) for inst, v in snaps.groupby("instance")["hit_rate"].mean().items()]


def eviction_churn(store: Store, since: float, until: float) -> list[Value]:
    """Per instance: the share of blocks stored in the window that had been stored (and so lost) before."""
    frame = queries.restored_blocks(store, since, until)
    return [(r.instance, None, float(r.restored or 0) / r.stored) for r in frame.itertuples() if r.stored]


def session_prefix_lost_idle(store: Store, since: float, until: float) -> list[Value]:
    """Per session: blocks lost while idle (in a tool pause) during the window."""
    frame = queries.session_idle_losses(store, until)
    out = []
    for (session_id, instance), group in frame.groupby(["session_id", "instance"]):
        inside, before = group[group["ts"] >= since], group[group["ts"] < since]
        if inside.empty:
            continue
        base = before.sort_values("ts")["session_evicted_idle_blocks"].iloc[-1] if not before.empty else 0
        lost = inside["session_evicted_idle_blocks"].max() - base
        if lost > 0:
            out.append((instance, session_id, float(lost)))
    return out


def step_failure_rate(store: Store, since: float, until: float, min_steps: int = 5) -> list[Value]:
    total, failed = queries.step_counts(store, since, until)
    if not total or total < min_steps:
        return []
    return [(None, None, failed / total)]


def ttft_slo_burn(store: Store, since: float, until: float, slo_s: float = 2.0, objective: float = 0.95):
    """Per instance: the share of requests whose TTFT missed `slo_s`, over the error budget `1 - objective`."""
    reqs = queries.requests(store, since, until).dropna(subset=["ttft_s"])
    budget = max(1.0 - objective, 1e-9)
    return [(inst, None, float((group["ttft_s"] > slo_s).mean()) / budget)
            for inst, group in reqs.groupby("instance")]  # fmt: skip


def instance_up(store: Store, since: float, until: float) -> list[Value]:
    """Per scraped instance: its latest `up` sample in the window (1 answered, 0 did not)."""
    samples = queries.metric_series(store, ["up"], since, until)
    return [(inst, None, float(g["value"].iloc[-1])) for inst, g in samples.groupby("instance")]


SIGNALS: dict[str, Signal] = {
    "kv_usage": Signal(kv_usage, (), "mean pinned KV usage per instance"),
    "preemptions_per_min": Signal(preemptions_per_min, (), "preemptions per minute per instance"),
    "hit_rate": Signal(hit_rate, (), "mean prefix-cache hit rate per instance"),
    "eviction_churn": Signal(eviction_churn, (), "share of stored blocks that had been stored before"),
    "session_prefix_lost_idle": Signal(session_prefix_lost_idle, (), "blocks a session lost while idle"),
    "step_failure_rate": Signal(step_failure_rate, ("min_steps",), "failed agent steps / steps"),
    "ttft_slo_burn": Signal(ttft_slo_burn, ("slo_s", "objective"), "TTFT SLO error-budget burn rate"),
    "instance_up": Signal(instance_up, (), "latest `up` scrape sample per instance"),
}
