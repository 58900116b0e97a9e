"""What `kvobs report` says about a range, as sections (`Section`): each a title, its words, a table and a figure,
and the sample it counts. Computed by the analyses the pages and `kvobs whatif` use, never a figure of its own.

    sections = report_sections(store, since, until, sizes=None, ttls=TTLS, gpu_hour_cost=None)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from instrumented_engine.whatif.fidelity import fidelity
from instrumented_engine.whatif.runs import comparison, observed_total, replay_plans, simulate_runs
from instrumented_engine.whatif.session_kinds import ages_and_reuse
from instrumented_engine.whatif.time_saved import SAVED_WORDS, sizes_saved
from instrumented_engine.whatif.ttl_knee import knee, knee_words
from instrumented_engine.whatif.victim_choice import choice_words, other_policy
from kvobs.analytics.cache import (
    FLEET,
    ages_words,
    measured_lookups,
    range_preemptions,
    reuse_words,
    shortfall,
    store_lookups,
    tax_table,
    tax_words,
)
from kvobs.semconv.reasons import EvictionPolicyName

TTLS = (0.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)  # the TTL curve's points (s): the published knees lie in it
TOP_SESSIONS = 10
SESSION_TTL = EvictionPolicyName.SESSION_TTL.value


@dataclass(frozen=True)
class Figure:
    """A chart: `kind` "line" (x against each y column) or "bar" (stacked, one bar per row of `frame`)."""

    kind: str
    frame: pd.DataFrame
    x: str
    ys: list[str]
    x_label: str
    y_label: str
    marks: dict[str, float] = field(default_factory=dict)  # vertical lines: label -> x (a knee, the observed size)
    log_x: bool = False


@dataclass(frozen=True)
class Section:
    title: str
    words: list[str]
    table: pd.DataFrame | None = None
    figure: Figure | None = None
    sample: str = ""  # what the section's figures count


def report_sections(
    store, since, until, *, sizes: tuple[int, ...] | None = None, ttls=TTLS, gpu_hour_cost: float | None = None
) -> list[Section]:
    """The report of [since, until] (None: the store's first or last row)."""
    span = store.reads.time_range()
    if span is not None:
        since, until = span[0] if since is None else since, span[1] if until is None else until
    requests = store.reads.requests(since, until)
    steps = store.reads.steps(since, until)
    lookups = measured_lookups(store, requests)
    if lookups is None:
        lookups, _ = store_lookups(store, requests, steps, since, until)
    sessions = requests["session_id"].nunique() if not requests.empty else 0
    sample = f"{len(lookups):,} requests whose hash chain is known, of {len(requests):,} ({sessions:,} sessions)"
    plans = replay_plans(store, since, until)
    observed = observed_total(plans, store, since, until)
    check, checks = fidelity(plans, observed["hit"])
    return [
        *_shortfall_sections(store, since, until, lookups, sample),
        _whatif_section(store, since, until, plans, observed, check, checks, sizes, gpu_hour_cost),
        _ttl_section(store, since, until, plans, checks, ttls),
    ]


def _shortfall_sections(store, since, until, lookups: pd.DataFrame, sample: str) -> list[Section]:
    if lookups.empty:
        missing = ["Not measured: no request's hash chain is known in this range (it needs the engines' KV events)."]
        return [Section("Hit rate and its shortfall", missing), Section("Recompute tax", missing)]
    split = shortfall(lookups, "instance")
    preempted = range_preemptions(store, since, until)
    instances = split["instance"][split["instance"] != FLEET]
    tax = tax_table(split, "instance", preempted.by("instance", instances))
    fleet = split[split["instance"] == FLEET].iloc[0]
    words = [
        f"Achieved {fleet['achieved_rate']:.1%} of the prompt tokens in whole blocks, where a cache that never "
        f"evicted would have held {fleet['available_rate']:.1%}; each missed block counted once, by why."
    ]
    causes = [c for c in tax.columns if c.startswith("recomputed_") and c != "recomputed_tokens"]
    bars = tax.set_index("instance")[causes].fillna(0).reset_index()
    tax_section = Section(
        "Recompute tax",
        [f"{row['instance']}: {tax_words(row)}." for _, row in tax.iterrows()],
        tax,
        Figure("bar", bars, "instance", causes, "instance", "recomputed tokens"),
        sample,
    )
    by_session = shortfall(lookups, "session_id", total=None)
    served = lookups.groupby("session_id")["instance"].agg(set).to_dict()
    session_tax = tax_table(by_session, "session_id", preempted.by("session_id", by_session["session_id"], served))
    top = session_tax.sort_values("recomputed_tokens", ascending=False, kind="stable").head(TOP_SESSIONS)
    sessions = Section(
        "Sessions that cost the most",
        [f"The {len(top)} sessions that recomputed the most prompt tokens, with why."],
        top,
        sample=sample,
    )
    return [Section("Hit rate and its shortfall", words, split, sample=sample), tax_section, sessions]


def _whatif_section(store, since, until, plans, observed, check, checks, sizes, gpu_hour_cost) -> Section:
    size = observed.get("num_blocks")
    if sizes is None:
        sizes = tuple(sorted({max(2, size // 2), size, size * 2, size * 4})) if size else (32, 64, 128, 256)
    runs = [simulate_runs(plans, num_blocks=n) for n in sizes]
    table = pd.DataFrame(comparison(observed, [total for total, _ in runs]))
    saved, prices = sizes_saved(
        store, plans, checks, [total for total, _ in runs], since, until, gpu_hour_cost=gpu_hour_cost
    )
    priced = pd.DataFrame([entry.row() for entry in saved])
    merged = table.merge(priced, on=["configuration", "blocks"], how="left")  # (the observed row: not priced)
    curve = pd.DataFrame({"blocks": [r.num_blocks for r, _ in runs], "hit rate": [r.hit_rate for r, _ in runs]})
    replayed = sum(len(p.requests) for p in plans)
    return Section(
        "What-if: other cache sizes",
        [check.describe(), prices.rate_words(), SAVED_WORDS.format(gpus=1)],
        merged,
        Figure("line", curve, "blocks", ["hit rate"], "cache size (blocks)", "hit rate", _observed(size)),
        f"{replayed:,} requests replayed",
    )


def _observed(size: int | None) -> dict[str, float]:
    return {} if not size else {"observed": float(size)}


def _ttl_section(store, since, until, plans, checks, ttls) -> Section:
    size = next((c.num_blocks for c in checks if c.num_blocks is not None), None)
    if size is None:
        return Section("TTL curve", ["Not measured: the runs' cache size is unknown (no snapshot says it)."])
    points = [(ttl, simulate_runs(plans, num_blocks=size, policy=SESSION_TTL, ttl_s=ttl)[0].hit_rate) for ttl in ttls]
    found = knee(points)
    curve = pd.DataFrame({"TTL (s)": [max(t, 1.0) for t, _ in points], "hit rate": [r for _, r in points]})
    ages, reuse = ages_and_reuse(store, since, until)
    words = [knee_words(size, points), ages_words(ages), reuse_words(reuse)]
    said = choice_words(other_policy(plans, checks, ttls[2] if len(ttls) > 2 else ttls[-1]))
    words += [] if said is None else [said]
    return Section(
        f"TTL curve at the observed size ({size:,} blocks)",
        words,
        pd.DataFrame({"TTL (s)": [t for t, _ in points], "hit rate": [r for _, r in points]}),
        Figure(
            "line",
            curve,
            "TTL (s)",
            ["hit rate"],
            "session TTL (s, log; 0 drawn at 1)",
            "hit rate",
            {} if found is None else {"knee": max(found, 1.0)},
            log_x=True,
        ),
        f"{sum(len(p.requests) for p in plans):,} requests replayed",
    )
