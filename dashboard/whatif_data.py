"""The What-if page's data: the engine's replay of a range, as typed results the page's views read. The views never
import the engine (`instrumented_engine.whatif`); this module is where the page meets it.

    plans = replay_plans(store, since, until, instances)
    sizes = size_replay(store, plans, since, until, instances, (32, 64), "lru", 30.0)   # SizeReplay
    routers = router_replay(store, since, until, 1.0)                                   # RouterReplay
    sweep = tier_sweep(store, plans, (16, 32))                                          # TierSweep
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from kvobs.store import Store

if TYPE_CHECKING:  # (the engine is imported where a replay runs: a page that shows none never loads it)
    from instrumented_engine.whatif.fidelity import Fidelity


@dataclass(frozen=True)
class SizeReplay:
    """The range replayed at several cache sizes: the table of the runs together, each run's own (span, table,
    check) where there are several, the requests replayed and skipped, and the replay's check at the observed point
    (`whatif.fidelity.Fidelity`)."""

    table: pd.DataFrame
    per_run: list[tuple]
    replayed: int
    skipped: int
    check: Fidelity
    notes: tuple[str, ...]  # what the caption adds: one run for a range of several, requests counted once, tied ones
    pauses_note: str | None  # why the tool-pause losses are not compared, where they are not
    saved: pd.DataFrame  # each size's hits as time to first token saved (`whatif.time_saved.SAVED_COLUMNS`)
    saved_words: str  # the rates that priced them, and what the columns count


@dataclass(frozen=True)
class RouterReplay:
    """The fleet's traffic under each router: a row per router, the requests replayed and skipped, each replica's
    size, the `as_routed` replay's check, and how the replay runs (in words)."""

    table: pd.DataFrame
    replayed: int
    skipped: int
    sizes: dict[str, int]
    check: Fidelity
    replay_words: str


@dataclass(frozen=True)
class TierSweep:
    """The same blocks added to an offload tier below each run's cache, or to the cache: the rows, the runs left
    out with why (in words), and the table's legend."""

    table: pd.DataFrame
    left_out: str
    legend: str


def replay_plans(store: Store, since, until, instances) -> list:
    """The range's replay plans (`whatif.runs.replay_plans`), built once for every replay the page makes of them."""
    from instrumented_engine.whatif.runs import replay_plans as plans_of

    return plans_of(store, since, until, instances=instances)


def size_replay(
    store: Store, plans: list, since, until, instances, sizes: tuple[int, ...], policy: str, ttl_s: float
) -> SizeReplay:
    """Each plan replayed at each of `sizes` (`policy`, `ttl_s`), beside what was observed."""
    from instrumented_engine.whatif.fidelity import PAUSES_NOT_COMPARABLE, fidelity
    from instrumented_engine.whatif.replay import DUPLICATES, INFERRED
    from instrumented_engine.whatif.runs import COMPARISON, comparison, observed_total, simulate_runs
    from instrumented_engine.whatif.time_saved import SAVED_COLUMNS, SAVED_WORDS, sizes_saved

    results = [simulate_runs(plans, num_blocks=n, policy=policy, ttl_s=ttl_s) for n in sizes]

    def table(observed: dict, replays) -> pd.DataFrame:
        return pd.DataFrame(comparison(observed, replays), columns=list(COMPARISON))

    observed = observed_total(plans, store, since, until, instances)
    check, checks = fidelity(plans, observed["hit"])
    per_run = []
    if len(plans) > 1:
        per_run = [(p.span, table(p.observed, [r[i] for _, r in results]), checks[i]) for i, p in enumerate(plans)]
    saved, prices = sizes_saved(store, plans, checks, [total for total, _ in results], since, until)
    replayed, skipped, duplicates, inferred = (
        sum(getattr(p, k) for p in plans) for k in ("num_requests", "skipped", "duplicates", "inferred")
    )
    notes = []
    if plans[0].span is not None and plans[0].span.run_id is None:
        notes.append("No engine runs are recorded: the range is replayed as one run.")
    if duplicates:
        notes.append(DUPLICATES.format(duplicates).capitalize() + ".")
    if inferred:
        notes.append(INFERRED.format(inferred) + ".")
    return SizeReplay(
        table(observed, [t for t, _ in results]),
        per_run,
        replayed,
        skipped,
        check,
        tuple(notes),
        None if check.pauses_comparable else PAUSES_NOT_COMPARABLE,
        pd.DataFrame([entry.row() for entry in saved], columns=list(SAVED_COLUMNS)).drop(columns=["cost saved"]),
        f"{prices.rate_words()}. {SAVED_WORDS.format(gpus=1)}",
    )


def router_replay(store: Store, since, until, prefill_load_scale: float) -> RouterReplay:
    """The fleet's traffic of the range under each router (`kvobs whatif --replicas`)."""
    from instrumented_engine.whatif.fidelity import fleet_fidelity
    from instrumented_engine.whatif.fleet import FLEET_COLUMNS, POLICIES, FleetPlan, fleet_rows, simulate_fleet
    from instrumented_engine.whatif.replay import REPLAY_WORDS
    from kvobs.semconv.reasons import RouterPolicy

    fleet = FleetPlan.from_store(store, since, until)
    results = [simulate_fleet(fleet, policy, prefill_load_scale=prefill_load_scale) for policy in POLICIES]
    check = fleet_fidelity(fleet, next(r for r in results if r.policy == RouterPolicy.AS_ROUTED.value))
    table = pd.DataFrame(fleet_rows(results), columns=list(FLEET_COLUMNS))
    return RouterReplay(table, len(fleet.plan.requests), fleet.plan.skipped, dict(fleet.sizes), check, REPLAY_WORDS)


def tier_sweep(store: Store, plans: list, extra: tuple[int, ...], iso) -> TierSweep:
    """`whatif.tier_sweep`: the observed setup, then each number of blocks added to a tier or to the cache; `iso`:
    how the page writes a time (the runs left out are named by theirs)."""
    from instrumented_engine.whatif.tier_sweep import SWEEP_COLUMNS, SWEEP_LEGEND, describe_left_out
    from instrumented_engine.whatif.tier_sweep import tier_sweep as sweep

    rows, left_out = sweep(plans, store, extra)
    said = describe_left_out(left_out, iso) if left_out else ""
    return TierSweep(pd.DataFrame(rows, columns=list(SWEEP_COLUMNS)), said, SWEEP_LEGEND)
