"""Routing loss as the collector's counters, for Prometheus' `FleetRoutingLoss` alert: the same analysis the
dashboard and `kvobs alerts` run (`kvobs.analytics.routing`), fed from the store in time order, each request once.

    meter = RoutingMeter(store, instances=["vllm-a", "vllm-b"])
    meter.run(now)       # every ROUTING_INTERVAL_S from the collector's tick
    meter.routed_tokens, meter.compared_tokens, meter.compared_requests     # instance -> total

One `FleetIndex` (which replica holds which block) lives across runs and is advanced once through the KV events
as they reach the store. A run looks at what is surely written: events up to `delay_s` ago, and the requests that
looked their prefix up before `REQUEST_S` earlier than that (the blocks a request stores come after its lookup,
up to its end). A request written later than that (a span that arrived late) is not counted, and said
(`num_late`, a log line). Only requests of this collector's own instances are counted, so several collectors into
one store count each request once; the other replicas they are compared with are any in the store.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pandas as pd

from kvobs.analytics.chains import with_sessions
from kvobs.analytics.routing import RESIDENCY_LOOKBACK_S, ROUTING_KINDS, FleetCheck, FleetIndex, routing_losses
from kvobs.store.interface import Store

log = logging.getLogger(__name__)

ROUTING_INTERVAL_S = 60.0  # how often the collector measures
DELAY_S = 60.0  # how far behind now a run reads: the writer's queue and late spans have landed
REQUEST_S = 120.0  # a request's blocks are stored within this long of its lookup


class RoutingMeter:
    def __init__(self, store: Store, instances: list[str], *, delay_s: float = DELAY_S) -> None:
        self.store, self.instances, self.delay_s = store, set(instances), delay_s
        self.index = FleetIndex()
        self.check: FleetCheck | None = None
        self.done: float | None = None  # lookups and events up to here are counted and applied
        self.routed_tokens: Counter[str] = Counter()
        self.compared_tokens: Counter[str] = Counter()
        self.compared_requests: Counter[str] = Counter()
        self.num_late = 0  # requests written after their lookup was passed
        self._counted: dict[str, float] = {}  # recent request ids already measured (or told late) -> arrival

    def run(self, now: float) -> int:
        """Measure the requests that looked up since the last run; returns how many were compared."""
        if len(self.store.reads.instances()) < 2:
            self.done, self.index = None, FleetIndex()  # nothing to compare with: warmed again when a second comes
            return 0
        written = now - self.delay_s
        cutoff = written - REQUEST_S
        first = self.done is None
        start = cutoff - RESIDENCY_LOOKBACK_S if first else float(np.nextafter(self.done, np.inf))
        if self.done is not None and cutoff <= self.done:
            return 0
        events = self.store.reads.kv_events(start, written, kinds=ROUTING_KINDS)
        requests = self.store.reads.requests(start - REQUEST_S, written)
        if not requests.empty:
            looked_up = requests["arrival_ts"] + requests["queue_s"].fillna(0.0)  # chains.lookup_ts, per column
            mine = requests["instance"].isin(self.instances) & (looked_up <= cutoff)
            if first:
                mine &= False  # the first run warms the index only
            else:
                self._count_late(requests[mine & (looked_up <= self.done)])
                mine &= looked_up > self.done
            requests = requests[mine]
        if not requests.empty:  # vLLM's request spans carry no session: their steps' do
            requests = with_sessions(requests, self.store.reads.steps(start - REQUEST_S, written))
        self.check = FleetCheck.of(events, requests, base=self.check, hashes=False)
        losses = routing_losses(requests, events, self.check, self.index, apply_until=cutoff)
        self.done = cutoff
        self._counted.update(zip(requests["request_id"], requests["arrival_ts"]))
        horizon = cutoff - 3 * REQUEST_S  # older ids can no longer be read back by a run
        self._counted = {rid: ts for rid, ts in self._counted.items() if ts >= horizon}
        for instance, group in losses.groupby("instance"):
            self.routed_tokens[instance] += int(group["routed_tokens"].sum())
            self.compared_tokens[instance] += int(group["prompt_tokens"].sum())
            self.compared_requests[instance] += len(group)
        return len(losses)

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
                self.delay_s + REQUEST_S,
            )
