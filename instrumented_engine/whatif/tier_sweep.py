"""CPU tier or more GPU memory? Each run replayed at its observed size and policy with an offload tier of each size
below its cache, beside the same runs with the cache itself grown by as many blocks: the tool-pause losses each
would have given back, and the prompt tokens (and, at the run's measured prefill rate, seconds) no longer
recomputed. A tier block is host memory and a cache block device memory, so the rows compare what each block buys,
not what it costs.

    rows, left_out = tier_sweep(plans, store, extra=(16, 32, 64))  # dicts of `SWEEP_COLUMNS`, the observed setup
    describe_left_out(left_out, clock_iso)                        # the runs not in it, and why

The tier is vLLM's CPU offloading as our engine runs it (`whatif.tier`): write-through, LRU, a prefix found past the
cache's hits is loaded, not recomputed. A loaded block's copy takes time a replay does not measure: the seconds
here are those of the recompute alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from instrumented_engine.whatif.fidelity import DEFAULT_POLICY
from instrumented_engine.whatif.replay import ReplayPlan, simulate
from instrumented_engine.whatif.units import WhatIfResult
from kvobs.analytics.cache import RATE_WINDOW_S, PrefillRates
from kvobs.analytics.runs import Span
from kvobs.store.interface import Store
from kvobs.times import local_time

NONE, TIER, CACHE = "none", "offload tier", "bigger cache"
# the sweep's table, in the terminal and on the What-if page (`tier_sweep`)
SWEEP_COLUMNS = (
    "added",
    "blocks added",
    "hit rate",
    "loaded from tier (tokens)",
    "recomputed tokens",
    "recompute (s)",
    "lost in tool pauses",
    "given back by the tier",
)


SWEEP_LEGEND = (
    "CPU tier or more cache: each run at its observed size and policy; none is its own setup, then each number of "
    "blocks added to an offload tier below the cache (write-through, LRU, as vLLM's CPU offloading) or to the cache. "
    "hit rate: prompt tokens not computed (found in the cache or loaded from the tier) / prompt tokens. recompute "
    "(s): the recomputed tokens at the run's measured prefill rate (a tier load's copy time is not in it). lost in "
    "tool pauses: blocks a session lost while it waited on a tool and did not get back from the tier."
)


@dataclass
class _Sum:
    """Runs' replays added up; `recompute_s` None once a run's prefill rate is unknown."""

    hit_tokens: int = 0
    query_tokens: int = 0
    tier_hit_tokens: int = 0
    recompute_tokens: int = 0
    recompute_s: float | None = 0.0
    lost_in_pause: int = 0
    saved_in_pause: int = 0

    def add(self, result: WhatIfResult, seconds_per_token: float | None) -> None:
        self.hit_tokens += result.hit_tokens
        self.query_tokens += result.query_tokens
        self.tier_hit_tokens += result.tier_hit_tokens
        self.recompute_tokens += result.recompute_tokens
        if self.recompute_s is not None and seconds_per_token is not None:
            self.recompute_s += result.recompute_tokens * seconds_per_token
        else:
            self.recompute_s = None
        self.lost_in_pause += result.lost_in_pause_blocks - result.saved_in_pause_blocks
        self.saved_in_pause += result.saved_in_pause_blocks

    def row(self, added: str, blocks: int) -> dict:
        rate = self.hit_tokens / self.query_tokens if self.query_tokens else None
        values = (
            added,
            blocks,
            rate,
            self.tier_hit_tokens,
            self.recompute_tokens,
            self.recompute_s,
            self.lost_in_pause,
            self.saved_in_pause,
        )
        return dict(zip(SWEEP_COLUMNS, values))


def tier_sweep(
    plans: list[ReplayPlan], store: Store, extra: tuple[int, ...]
) -> tuple[list[dict], list[tuple[Span | None, str]]]:
    """The runs at their observed setup (each its size, policy and recorded tier), then for each of `extra` blocks:
    that many blocks added to each run's offload tier (a tier of that many where it had none), and as many added
    to its cache; and the runs left out, with why: no request with a known chain, a cache size no snapshot says,
    a tier whose size the run did not record (`ValueError` when every run is left out)."""
    sized, left_out = [], []
    for plan in plans:
        if not plan.requests:
            left_out.append((plan.span, "no request with a known block chain"))
        elif not plan.observed.get("num_blocks"):
            left_out.append((plan.span, "its cache size is unknown (no snapshot says it)"))
        elif plan.tier_blocks is None and plan.observed.get("tier_events"):
            left_out.append((plan.span, "it had an offload tier (its tier events say so) whose size it did not record"))
        else:
            sized.append(plan)
    if not sized:
        raise ValueError("no run in this range can start the sweep: " + describe_left_out(left_out, local_time))
    sums = {(NONE, 0): _Sum(), **{(kind, n): _Sum() for n in extra for kind in (TIER, CACHE)}}
    for plan in sized:
        size, policy, tier = plan.observed["num_blocks"], plan.policy or DEFAULT_POLICY, plan.tier_blocks or 0
        per_token = _seconds_per_token(plan, store)
        sums[(NONE, 0)].add(simulate(plan, num_blocks=size, policy=policy, tier_blocks=tier), per_token)
        for n in extra:
            sums[(TIER, n)].add(simulate(plan, num_blocks=size, policy=policy, tier_blocks=tier + n), per_token)
            sums[(CACHE, n)].add(simulate(plan, num_blocks=size + n, policy=policy, tier_blocks=tier), per_token)
    return [total.row(kind, n) for (kind, n), total in sums.items()], left_out


def describe_left_out(left_out: list[tuple[Span | None, str]], clock_iso) -> str:
    """`vllm-a, run started ...: why; ...` ("" when none was left out)."""
    return "; ".join(f"{'the range' if span is None else span.label(clock_iso)}: {why}" for span, why in left_out)


def _seconds_per_token(plan: ReplayPlan, store: Store) -> float | None:
    """The run's measured prefill cost per uncached token, at its last request (None: not measured)."""
    if plan.span is None or plan.span.instance is None:
        return None
    end = max(r.finished_ts for r in plan.requests)
    rate = PrefillRates.from_store(store, end - RATE_WINDOW_S, end).at(plan.span.instance, end)
    return None if rate is None else rate.seconds(1)
