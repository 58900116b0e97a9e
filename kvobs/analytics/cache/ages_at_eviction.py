"""How old a block was when its cache evicted it: its latest store to its eviction (`kv_events.lifetime_s` of a device
removal, or of our engine's eviction, known as the row is made), the distribution a TTL pin is read beside (`kvobs
whatif --policy session_ttl --ttl ...`), overall and per agent (a session kind: the SDK's `agent_name`).

    ages = eviction_ages(store.reads.kv_events(since, until, kinds=[REMOVED]), store.reads.sessions())
    ages[ALL].count, ages[ALL].unknown, ages[ALL].quantiles     # {0.5: s, 0.9: s, 0.99: s}: NaN where too few

Counted once a block (its first owner's row): the removals the cache made for room or by its TTL (no reason, as vLLM
sends them; `capacity`; `ttl`), not a session's own release, an invalidation or a reset. A block whose store the
stream did not show (stored before the collector started) has no age: it is counted as unknown, never as an age.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.samples import min_sample, quantile
from kvobs.semconv.reasons import EvictionReason

ALL = "every session"
QUANTILES = (0.5, 0.9, 0.99)
EVICTIONS = (EvictionReason.CAPACITY.value, EvictionReason.TTL.value)  # and no reason: taken for room


@dataclass(frozen=True)
class EvictionAges:
    count: int  # evicted blocks with a known age
    unknown: int  # evicted blocks whose store the stream did not show
    quantiles: dict[float, float]  # q -> age in seconds; NaN with fewer than `samples.min_sample(q)` ages


def eviction_ages(
    removed: pd.DataFrame, sessions: pd.DataFrame | None = None, kinds: pd.Series | None = None
) -> dict[str, EvictionAges]:
    """`ALL`'s ages, then each agent's (by `sessions`' `agent_name`), from device removal rows (`kv_events` of kind
    `removed`, or `evicted`); `kinds`: each row's session kind instead (aligned with `removed`: a tool, a session)."""
    if removed.empty:
        return {ALL: _ages(pd.Series(dtype=float))}
    reasons = removed["reason"]
    evicted = removed[(removed["first_owner"] == 1) & (reasons.isna() | reasons.isin(EVICTIONS))]
    out = {ALL: _ages(evicted["lifetime_s"])}
    if kinds is not None:
        named = kinds.loc[evicted.index]
    elif sessions is not None and not sessions.empty and "agent_name" in sessions:
        agents = sessions.dropna(subset=["agent_name"]).set_index("session_id")["agent_name"]
        named = evicted["session_id"].map(agents)
    else:
        return out
    for kind in sorted(named.dropna().astype(str).unique()):
        out[kind] = _ages(evicted.loc[named.astype(str) == kind, "lifetime_s"])
    return out


def _ages(lifetimes: pd.Series) -> EvictionAges:
    return distribution(lifetimes.dropna(), int(lifetimes.isna().sum()))


def distribution(seconds: pd.Series, unknown: int) -> EvictionAges:
    """Known durations (seconds) and how many more are unknown, as a distribution (`QUANTILES`)."""
    known = pd.to_numeric(seconds, errors="coerce").dropna()
    return EvictionAges(count=len(known), unknown=unknown, quantiles={q: quantile(known, q) for q in QUANTILES})


def ages_words(ages: dict[str, EvictionAges]) -> str:
    """The ages as `kvobs whatif` prints them beside a TTL sweep, a line per session kind."""
    title = "Eviction ages (a block's latest store to its eviction, in the range's removals):"
    return distribution_words(title, "evicted blocks", "whose store was not seen", ages)


def distribution_words(title: str, noun: str, unknown_words: str, dists: dict[str, EvictionAges]) -> str:
    """`title`, then a line per session kind: how many `noun`, p50, p90 and p99 where enough give them, and how
    many more are unknown (`unknown_words`)."""
    lines = [title]
    for kind, a in dists.items():
        if not a.count:
            lines.append(f"- {kind}: no {noun} with a known time ({a.unknown:,} {unknown_words})")
            continue
        shown = [
            f"p{q * 100:g} {a.quantiles[q]:,.1f} s"
            if a.quantiles[q] == a.quantiles[q]
            else f"p{q * 100:g} not shown (fewer than {min_sample(q)})"
            for q in QUANTILES
        ]
        more = f"; {a.unknown:,} more {unknown_words}" if a.unknown else ""
        lines.append(f"- {kind}: {a.count:,} {noun}: {', '.join(shown)}{more}")
    return "\n".join(lines)
