"""What each page's data function (`dashboard.data`, `dashboard.verdicts`) returns: one frozen dataclass a page, its
fields the frames and counts the page draws. Series are on the page's window grid (`dashboard.series`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class FleetTable:
    """Per instance: a row of totals (`table`, most blocks lost first) and, for each `FLEET_SERIES` measure, a frame
    of one column per instance (`series`); an instance that did not report a measure has no column (unknown)."""

    table: pd.DataFrame
    series: dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Overview:
    """The Overview's KPIs (`kpis`: label -> value, as the page shows them) and series; `fleet` with `per_instance`."""

    kpis: dict
    fleet: FleetTable | None
    num_snapshots: int
    watching_kv: bool  # a KV event stream reported in the range
    num_kv_events: int  # what a range's routing replay reads
    usage: pd.DataFrame
    resident: pd.DataFrame
    hit_rate: pd.DataFrame
    latency: pd.DataFrame
    ttft_points: pd.DataFrame | None  # each request's TTFT, when the range has few enough to draw
    preemptions: pd.DataFrame
    evictions: pd.DataFrame
    steps: pd.DataFrame


@dataclass(frozen=True)
class FleetRouting:
    """The routing loss over the range (`summary`, the fleet's row last), what could not be compared (`notes`), and
    the hit-rate shortfall split (`shortfall`, `spread`): `source` "measured" (the collector's lookups: from
    `measured_from` to `measured_to`, the requests after it `pending`, the instances never measured `unmeasured`) or
    "replay" (the range's KV events)."""

    source: str
    summary: pd.DataFrame
    notes: list
    compared: int
    requests: int
    shortfall: pd.DataFrame
    spread: dict  # `shortfall.hit_rate_spread`: its max is None with no replica measured
    measured_from: float | None = None
    measured_to: float | None = None
    pending: int = 0
    unmeasured: list[str] = field(default_factory=list)
    tax: pd.DataFrame | None = None  # the recompute tax per instance and fleet (`kvobs.analytics.cache.tax_reads`)


@dataclass(frozen=True)
class Pressure:
    """A pressure measure against a latency per window (`windows`), their lagged correlation, the strongest lag."""

    windows: pd.DataFrame
    correlation: pd.DataFrame
    strongest: dict | None


@dataclass(frozen=True)
class KVEventsPage:
    """Blocks stored and lost per window (`lifecycle`), lost by reason (`reasons`), `released` by the agents; the
    reuse tables over the latest `prefix_rows` stored blocks from `sample_since` (of `stored_in_range`)."""

    lifecycle: pd.DataFrame
    reasons: pd.DataFrame
    prefixes: pd.DataFrame
    restored: pd.DataFrame
    churn: dict
    released: int
    prefix_rows: int
    sample_since: float
    stored_in_range: int


@dataclass(frozen=True)
class AlertsPage:
    active: pd.DataFrame  # firing now
    history: pd.DataFrame  # the range's transitions
    holding: pd.DataFrame  # rules whose condition holds at the range's end, not (yet) for their whole `for`
    failed_steps: tuple[int, int]  # (failed, all) agent steps that started in the range
