"""The Sessions page's data: the sessions of a range, a session's steps with their verdicts (read whole where its
keeper decided them, attributed as the page opens where not), its steps by what the cache cost them, and its
hit-rate shortfall split."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.cache import (
    RATE_WINDOW_S,
    PrefillRates,
    footprint_timeline,
    measured_lookups,
    range_preemptions,
    request_routing,
    session_table,
    shortfall,
    store_lookups,
    tax_table,
    with_sessions,
)
from kvobs.analytics.steps import (
    ATTRIBUTION_KINDS,
    SessionRead,
    attribute_steps,
    decided_steps,
    session_verdicts,
    with_decided,
)
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store
from kvobs.store.rows import StepVerdictRecord


def sessions(store: Store, since: float, until: float, instances=None) -> pd.DataFrame:
    """The range's sessions, by what the cache cost them (`footprints.session_table`: blocks lost in tool pauses,
    then lost, then failed steps; footprints on `instances` only)."""
    outcomes = store.reads.step_outcomes(since, until)  # per session, aggregated in the database
    footprints = store.reads.session_footprints(since, until, instances=instances)
    table = session_table(store.reads.sessions(), footprints, outcomes)
    if not outcomes.empty:
        keep = set(outcomes["session_id"]) | set(footprints["session_id"])
        table = table[table["session_id"].astype(object).isin(keep)]  # (pandas' string isin: a Python loop)
    return table.reset_index(drop=True)


def sessions_with_steps(store: Store, since: float, until: float, instances=None) -> pd.DataFrame:
    """The range's sessions with steps, in the Sessions page's order (what the cache cost them first): `session_id`,
    `failed`."""
    table = sessions(store, since, until, instances)
    if table.empty or "steps" not in table:
        return pd.DataFrame(columns=["session_id", "failed"])
    table = table[table["steps"].fillna(0) > 0]
    return table.assign(failed=table["failed"].fillna(0).astype(int))[["session_id", "failed"]].reset_index(drop=True)


def steps_by_cache_cost(steps: pd.DataFrame) -> list[int]:
    """A session's step indexes (its attributed `session_detail` steps), by what the cache cost each (time lost to
    the cache over its typical step), then the most slowed, then the failed ones."""
    if steps.empty:
        return []
    cost = steps[["lost_excess_s", "invalidated_excess_s", "routed_excess_s", "preempted_excess_s"]]
    cost = cost.clip(lower=0).sum(axis=1)
    ranked = steps.assign(
        cost=cost, excess=steps["excess_s"].where(steps["slow"], 0.0), failed=steps["status"] == "error"
    )
    ranked = ranked.sort_values(["cost", "excess", "failed"], ascending=False, kind="stable", na_position="last")
    return [int(i) for i in ranked["step_index"]]


@dataclass(frozen=True)
class SessionDetail:
    """A session's page: its `footprint` timeline, its attributed `steps` (`attribute_steps`' columns and `verdict`:
    `decided` where a collector decided the step once the session settled, whose stored verdict the row shows, else
    `worked out`: as the page opened), the `requests` read, and the reads a step story shares (`read`). `verdicts`:
    each step's verdict as the one record type (`StepVerdictRecord`): the keeper's where it decided the step, else
    the page's own, decided now (`decided_at`: when the page worked it out)."""

    footprint: pd.DataFrame
    steps: pd.DataFrame
    requests: pd.DataFrame
    read: SessionRead | None
    verdicts: list[StepVerdictRecord]


def session_detail(store: Store, session_id: str) -> SessionDetail:
    """A settled session's steps as their keeper decided them, read whole (`decided_steps`: nothing attributed);
    a session with a step no keeper decided whole is attributed as the page opens, the decided verdicts laid over."""
    steps = store.reads.steps(session_id=session_id)
    snaps = store.reads.session_snapshots(session_id)
    footprint = footprint_timeline(snaps) if not snaps.empty else snaps
    if steps.empty:
        return SessionDetail(footprint, pd.DataFrame(), store.reads.requests(session_id=session_id), None, [])
    first, last = steps["started_at"].min(), steps[["started_at", "ended_at"]].max().max()
    # requests by time, not by session: vLLM's carry no session id (the attribution matches them by trace);
    # from the prefill rate's window before the first step
    reqs = store.reads.requests(first - RATE_WINDOW_S, last)
    decided = store.reads.step_verdicts(session_id=session_id)
    attributed = decided_steps(decided, steps)
    if attributed is None:
        attributed = _attributed(store, session_id, steps, reqs, first, last)
        verdicts = session_verdicts(attributed, decided, now=time.time())
        attributed = with_decided(attributed, decided)
    else:
        verdicts = session_verdicts(attributed, decided, now=time.time())  # the stored ones, every one
    # the reads a step story shares
    return SessionDetail(footprint, attributed, reqs, SessionRead(steps, reqs, attributed), verdicts)


def _attributed(
    store: Store, session_id: str, steps: pd.DataFrame, reqs: pd.DataFrame, first: float, last: float
) -> pd.DataFrame:
    """`attribute_steps` over the session's steps, from its KV events, the resets and prefill rates of its span."""
    events = store.reads.kv_events(kinds=ATTRIBUTION_KINDS, session_id=session_id)
    rates = PrefillRates.from_store(store, first - RATE_WINDOW_S, last, requests=reqs)
    resets = store.reads.kv_events(first, last, kinds=[KVEventKind.CLEARED.value])
    events = pd.concat([events, resets], ignore_index=True) if not resets.empty else events
    mine = with_sessions(reqs, steps)
    routing = request_routing(store, mine[mine["session_id"] == session_id], steps, first, last)  # a fleet's
    return attribute_steps(steps, reqs, events, rates=rates, routing=routing)


def session_shortfall(store: Store, session_id: str) -> pd.DataFrame:
    """The session's hit-rate shortfall split (`kvobs.analytics.cache.shortfall_split`, one row): from the lookups the
    collector measured when each of its requests has one, else replayed from the fleet's KV events over the
    session's span (and the hour before), so the page runs it when asked."""
    steps = store.reads.steps(session_id=session_id)
    if steps.empty:
        return pd.DataFrame()
    first, last = steps["started_at"].min(), steps[["started_at", "ended_at"]].max().max()
    reqs = with_sessions(store.reads.requests(first, last), steps)
    mine = reqs[reqs["session_id"] == session_id]
    lookups = measured_lookups(store, mine)  # as the collector measured them, else replayed
    if lookups is None:
        lookups, _ = store_lookups(store, mine, steps, first, last)
    return shortfall(lookups, "session_id", total=None) if not lookups.empty else pd.DataFrame()


def session_tax(store: Store, session_id: str, split: pd.DataFrame) -> pd.DataFrame:
    """The session's recompute tax (`kvobs.analytics.cache.recompute_tax`, one row) from its shortfall split
    (`session_shortfall`'s) and the preemptions of its span: not measured where one of the instances its requests
    ran on does not say what its preemptions recomputed."""
    steps = store.reads.steps(session_id=session_id)
    first, last = steps["started_at"].min(), steps[["started_at", "ended_at"]].max().max()
    reqs = with_sessions(store.reads.requests(first, last), steps)
    served = {session_id: set(reqs.loc[reqs["session_id"] == session_id, "instance"])}
    preempted = range_preemptions(store, first, last).by("session_id", [session_id], served=served)
    return tax_table(split, "session_id", preempted)
