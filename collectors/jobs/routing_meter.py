"""Each request's prefix lookup, measured once from the fleet's KV events as they reach the store, and written to it
(`request_lookups`; the writer keeps its per-minute rollup), and routing loss as the collector's counters, for
Prometheus' `FleetRoutingLoss` alert: the same analysis the dashboard and `kvobs alerts` run over a range
(`kvobs.analytics.cache.routing.request_lookups`), fed in time order, each request once.

    meter = RoutingMeter(store, ["vllm-a", "vllm-b"], write=writer.add_many, progress=writer.upsert)
    meter.run(now)       # every ROUTING_INTERVAL_S from the collector's tick
    meter.routed_tokens, meter.compared_tokens, meter.compared_requests     # instance -> total

One `FleetIndex` (which replica holds which block, and where and why each block was lost) lives across runs and is
advanced once through the KV events as they reach the store. A run looks at what is surely written: events up to
`delay_s` ago, and the requests that looked their prefix up before `REQUEST_S` earlier than that (the blocks a
request stores come after its lookup, up to its end). A request written later than that (a span that arrived
late) is not counted, and said (`num_late`, a log line). Only requests of this collector's own instances are
measured, so several collectors into one store write each request once; the other replicas they are compared
with are any in the store. After each run, how far each instance is measured (`lookup_progress`): a request that
looked up later is pending, one before it with no row was not measurable (its hash chain unknown). A session's
previous request (where its tool pause began) is remembered across runs,
and losses for `RESIDENCY_LOOKBACK_S`, as long as a range's replay reads back. A collector that starts warms its
index over that hour and measures from there; one that restarts resumes where its instances' `lookup_progress`
says the last one stopped (up to `RESUME_S` back, said in a log line), warming its index over the hour before, so a
restart leaves no unmeasured gap. Requests before that are not measured (the pages replay them), and said.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import fields

import numpy as np
import pandas as pd

from kvobs.analytics.cache import (
    RESIDENCY_LOOKBACK_S,
    ROUTING_KINDS,
    STORED,
    STORED_WITHIN_S,
    FleetCheck,
    FleetIndex,
    hashes_differ,
    lookup_times,
    pause_starts,
    request_lookups,
    with_sessions,
)
from kvobs.semconv.reasons import PairApart
from kvobs.store.interface import Store
from kvobs.store.rows import LookupProgressRecord, RequestLookupRecord
from kvobs.times import local_time

log = logging.getLogger(__name__)

ROUTING_INTERVAL_S = 60.0  # how often the collector measures
DELAY_S = 60.0  # how far behind now a run reads: the writer's queue and late spans have landed
REQUEST_S = STORED_WITHIN_S  # a request's blocks are stored within this long of its lookup
RESUME_S = 6 * 3600.0  # how far back a restarted meter measures what its predecessor left (a longer gap is said)
_INTS = tuple(f.name for f in fields(RequestLookupRecord) if f.type == "int")  # its counts (blocks, tokens, ...)


class RoutingMeter:
    def __init__(
        self,
        store: Store,
        instances: list[str],
        *,
        write: Callable[[list[RequestLookupRecord]], None] | None = None,
        progress: Callable[[LookupProgressRecord], object] | None = None,
        delay_s: float = DELAY_S,
        request_s: float = REQUEST_S,
    ) -> None:
        self.store, self.instances, self.write, self.progress = store, set(instances), write, progress
        self.delay_s, self.request_s = delay_s, request_s
        self.index = FleetIndex(track_losses=True)
        self.check: FleetCheck | None = None
        self.done: float | None = None  # lookups and events up to here are counted and applied
        self.routed_tokens: Counter[str] = Counter()
        self.compared_tokens: Counter[str] = Counter()
        self.compared_requests: Counter[str] = Counter()
        self.num_measured = 0  # request lookups written, ever
        self.resumed_from: float | None = None  # where a restarted meter took over from its predecessor's mark
        self._resuming = False  # until its first run: the hour before that mark warms the index
        self.unmeasured_s = 0.0  # lookup time left unmeasured: a predecessor stopped more than RESUME_S before
        self.num_late = 0  # requests written after their lookup was passed
        self._counted: dict[str, float] = {}  # recent request ids already measured (or told late) -> arrival
        self._ends: dict[str, tuple[float, float]] = {}  # session -> (arrival, end) of its latest request passed
        # whether two replicas' hashes can meet, from all the runs so far: sessions that ran on both (`crossed`;
        # session -> the replicas it ran on and when last seen), and pairs that stored a block alike (`met`)
        self.crossed: Counter[frozenset[str]] = Counter()
        self.met: set[frozenset[str]] = set()
        self._ran_on: dict[str, tuple[set[str], float]] = {}
        self.uncomparable: Counter[tuple[str, str]] = Counter()  # (instance, PairApart) -> requests not compared
        self._told: set[frozenset[str]] = set()  # pairs whose hashes never meet, logged once

    def run(self, now: float) -> int:
        """Measure the requests that looked up since the last run; returns how many were measured."""
        written = now - self.delay_s
        cutoff = written - self.request_s
        first = self.done is None
        if first:
            self.done = self._resumed_from(cutoff)  # None: nothing measured before: this run warms the index only
            first = self.done is None
        if self.done is not None and cutoff <= self.done:
            return 0
        if self.done is None:
            start = cutoff - RESIDENCY_LOOKBACK_S
        elif self._resuming:  # the hour before the predecessor's mark warms the index, as a start's
            start = self.done - RESIDENCY_LOOKBACK_S
        else:
            start = float(np.nextafter(self.done, np.inf))
        events = self.store.reads.kv_events(start, written, kinds=ROUTING_KINDS)
        read = self.store.reads.requests(start - self.request_s, written)
        if not read.empty:  # vLLM's request spans carry no session: their steps' do
            read = with_sessions(read, self.store.reads.steps(start - self.request_s, written))
        requests = passed = read
        if not read.empty:
            looked_up = lookup_times(read)
            passed = read[looked_up <= cutoff]
            mine = read["instance"].isin(self.instances) & (looked_up <= cutoff)
            if first:
                mine &= False  # the first run warms the index only
            else:
                if not self._resuming:  # (a resumed run reads back an hour: nothing in it came late)
                    self._count_late(read[mine & (looked_up <= self.done)])
                mine &= looked_up > self.done
            requests = read[mine]
        self._cross(passed, cutoff)  # (their blocks are in `events`: stored within `request_s` of the lookup)
        stored = events[events["kind"] == STORED] if not events.empty else events
        self.met |= self.index.meets(
            {str(name): set(group.dropna().map(int)) for name, group in stored.groupby("instance")["block_hash"]}
        )
        self.check = FleetCheck.of(events, requests, base=self.check, hashes=False, met=self.met, crossed=self.crossed)
        self._tell(self.check)
        pauses = pause_starts(read, self._ends) if not requests.empty else {}
        lookups = request_lookups(requests, events, self.check, self.index, apply_until=cutoff, pause_from=pauses)
        self.done, self._resuming = cutoff, False
        self._remember(passed, cutoff)
        self.index.forget_losses(cutoff - RESIDENCY_LOOKBACK_S)
        self._counted.update(zip(requests["request_id"], requests["arrival_ts"]))
        horizon = cutoff - 3 * self.request_s  # older ids can no longer be read back by a run
        self._counted = {rid: ts for rid, ts in self._counted.items() if ts >= horizon}
        compared = lookups[lookups["replicas_compared"] > 0]
        for instance in lookups.loc[lookups["replicas_compared"] == 0, "instance"]:
            self.uncomparable[str(instance), self.check.uncompared(str(instance))] += 1
        for instance, group in compared.groupby("instance"):
            self.routed_tokens[instance] += int(group["routed_tokens"].sum())
            self.compared_tokens[instance] += int(group["prompt_tokens"].sum())
            self.compared_requests[instance] += len(group)
        if self.write is not None and not lookups.empty:
            self.write(records(lookups, now))
        if self.progress is not None and not first:  # after its lookups, in the writer's order
            for instance in sorted(self.instances):
                self.progress(LookupProgressRecord(instance=instance, measured_to=cutoff, updated_at=now))
        self.num_measured += len(lookups)
        return len(lookups)

    def _resumed_from(self, cutoff: float) -> float | None:
        """Where the previous meter of these instances stopped (`lookup_progress`: the least of their marks), so this
        one measures from there; no further back than `RESUME_S` (the gap beyond is said); None: none measured."""
        progress = self.store.reads.lookup_progress(instances=sorted(self.instances))
        marks = pd.to_numeric(progress["measured_to"], errors="coerce").dropna() if not progress.empty else progress
        if len(marks) < len(self.instances) or not len(marks):
            return None  # an instance never measured: start afresh (its requests are replayed by the pages)
        mark = float(marks.min())
        if mark >= cutoff:
            return mark
        resumed = max(mark, cutoff - RESUME_S)
        if resumed > mark:
            self.unmeasured_s += resumed - mark
            log.warning(
                "routing meter: the previous collector measured %s up to %s; requests from then to %s are not "
                "measured (more than %.0f h back): the routing loss leaves them out "
                "(kvobs_collector_routing_unmeasured_seconds_total)",
                ", ".join(sorted(self.instances)),
                local_time(mark),
                local_time(resumed),
                RESUME_S / 3600,
            )
        log.info(
            "routing meter: resumes %s where the previous collector stopped, %s (%.0f s of requests to measure)",
            ", ".join(sorted(self.instances)),
            local_time(resumed),
            cutoff - resumed,
        )
        self.resumed_from, self._resuming = resumed, True
        return resumed

    def _remember(self, passed: pd.DataFrame, cutoff: float) -> None:
        """Each session's latest request of `passed`, those that looked up by `cutoff` (where its next request's
        pause begins; one that arrived by then but still queued is measured later, after this one), kept for
        `RESIDENCY_LOOKBACK_S` after its end."""
        passed = passed[passed["session_id"].notna()] if not passed.empty else passed
        if not passed.empty:
            latest = passed.sort_values("arrival_ts", kind="stable").groupby("session_id").tail(1)
            for session_id, arrival, end in zip(latest["session_id"], latest["arrival_ts"], latest["finished_ts"]):
                known = self._ends.get(session_id)
                if known is None or known[0] <= arrival:
                    self._ends[session_id] = (float(arrival), float(end))
        horizon = cutoff - RESIDENCY_LOOKBACK_S
        self._ends = {s: (a, e) for s, (a, e) in self._ends.items() if max(a, e if e == e else a) >= horizon}

    def _cross(self, read: pd.DataFrame, cutoff: float) -> None:
        """Count each session that runs on a replica it had not run on, for each pair that makes (kept for
        `RESIDENCY_LOOKBACK_S` after the session was last seen, as the index's memory of blocks)."""
        known = read.dropna(subset=["session_id"]) if not read.empty else read
        for session, group in known.groupby("session_id") if not known.empty else ():
            instances, last = set(map(str, group["instance"])), float(group["arrival_ts"].max())
            ran_on = self._ran_on.get(session, (set(), last))[0]
            for new in instances - ran_on:
                self.crossed.update(frozenset((new, old)) for old in ran_on)
                ran_on = ran_on | {new}
            self._ran_on[session] = (ran_on, last)
        horizon = cutoff - RESIDENCY_LOOKBACK_S
        self._ran_on = {s: (r, last) for s, (r, last) in self._ran_on.items() if last >= horizon}

    def _tell(self, check: FleetCheck) -> None:
        """A log line the first time a pair of replicas is left out because their block hashes never meet."""
        for pair, why in check.why.items():
            if why == PairApart.HASHES_DIFFER.value and pair not in self._told:
                self._told.add(pair)
                a, b = sorted(pair)
                log.warning(
                    '%s (kvobs_collector_routing_uncomparable_requests_total{reason="%s"})',
                    hashes_differ(a, b, self.crossed[pair]),
                    why,
                )

    def _count_late(self, passed: pd.DataFrame) -> None:
        """Requests whose lookup an earlier run had passed and did not count: they reached the store late."""
        new = [rid for rid in passed["request_id"] if rid not in self._counted]
        if new:
            self.num_late += len(new)
            self._counted.update(dict.fromkeys(new, float(self.done or 0.0)))
            log.warning(
                "%d request(s) reached the store more than %.0f s after their lookup: not counted in the routing "
                "loss (kvobs_collector_routing_late_requests_total)",
                len(new),
                self.delay_s + self.request_s,
            )


def records(lookups: pd.DataFrame, measured_at: float) -> list[RequestLookupRecord]:
    """`request_lookups` rows as the store's records."""
    out = []
    for row in lookups.to_dict("records"):
        session, best = row["session_id"], row["best_instance"]
        out.append(
            RequestLookupRecord(
                request_id=str(row["request_id"]),
                instance=str(row["instance"]),
                lookup_ts=float(row["lookup_ts"]),
                measured_at=measured_at,
                session_id=session if isinstance(session, str) else None,
                best_instance=best if isinstance(best, str) else None,
                **{name: int(row[name]) for name in _INTS},
            )
        )
    return out
