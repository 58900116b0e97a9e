"""The collector's routing-loss counters (`collectors.routing_meter`) are the store analysis's answer, fed in time
order a minute at a time: on the recorded vLLM run as a fleet of two replicas, the meter run every 30 s of the
recording counts each request once and finds the routing loss `kvobs.analytics.routing.fleet_losses` finds over
the whole run at once."""

from __future__ import annotations

from collectors.routing_meter import DELAY_S, REQUEST_S, RoutingMeter
from kvobs.analytics.routing import fleet_losses
from tests.runs import FLEET


def test_the_meter_counts_what_the_whole_run_analysis_finds(fleet_run):
    store = fleet_run.store
    first, last = store.reads.time_range()
    whole, _ = fleet_losses(store, store.reads.requests(), store.reads.steps(), first, last)
    assert whole["routed_tokens"].sum() > 0, "the recording shows no routing loss: nothing compared"
    meter = RoutingMeter(store, list(FLEET))
    now = first + DELAY_S + REQUEST_S - 1.0  # the first run warms the index up to just before the first lookup
    while meter.done is None or meter.done < last:
        meter.run(now)
        now += 30.0
    per_instance = whole.groupby("instance")["routed_tokens"].sum().to_dict()
    assert dict(meter.routed_tokens) == {name: int(n) for name, n in per_instance.items()}
    counted = sum(meter.compared_requests.values())
    assert 0.9 * len(whole) <= counted <= len(whole), (counted, len(whole))
    assert meter.num_late == 0


def test_a_single_replica_is_not_measured(vllm_run):
    meter = RoutingMeter(vllm_run.store, ["vllm"])
    first, last = vllm_run.store.reads.time_range()
    assert meter.run(last + DELAY_S + REQUEST_S + 1.0) == 0 and meter.done is None
