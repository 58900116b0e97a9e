"""The recompute tax of a range, read from a store: the shortfall split's parts per instance and for the fleet (the
lookups a collector measured, else replayed from the KV events) with what preemptions made the engines recompute
(`kvobs.analytics.cache.recompute_tax`).

    tax = range_tax(store, since, until)          # per instance, then "fleet": `TAX_COLUMNS`
    tax = shortfall_tax(store, since, until, table)   # ... of a shortfall table already made (the Overview's)
    preempted = range_preemptions(store, since, until)
"""

from __future__ import annotations

import pandas as pd

from kvobs.analytics.cache.recompute_tax import PREEMPTION_KINDS, Preemptions, preemption_recompute, tax_table
from kvobs.analytics.cache.routing import FLEET
from kvobs.analytics.cache.shortfall_split import shortfall, shortfall_of_sums, store_lookups
from kvobs.analytics.windows import lookup_range_sums
from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm

PREEMPTIONS_COUNTED = vllm.NUM_PREEMPTIONS.name + INCREASE_SUFFIX


def range_preemptions(store, since, until) -> Preemptions:
    """The range's preempted requests and what they recomputed; an engine that publishes no preemption rows is
    measured where its scraped preemption counter rose by nothing."""
    events = store.reads.kv_events(since, until, kinds=PREEMPTION_KINDS)
    samples = store.reads.metric_series([PREEMPTIONS_COUNTED], since, until)
    counted = {} if samples.empty else samples.groupby("instance")["value"].sum().to_dict()
    return preemption_recompute(events, {str(k): float(v) for k, v in counted.items()})


def range_tax(store, since, until, instances=None) -> pd.DataFrame:
    """Per instance, then the fleet's row (`FLEET`): the recompute tax (`TAX_COLUMNS`) of the requests that arrived
    in [since, until] (None: the store's first or last); empty where no request's hash chain is known."""
    span = store.reads.time_range() if since is None or until is None else (since, until)
    if span is not None:
        since, until = span[0] if since is None else since, span[1] if until is None else until
    sums = lookup_range_sums(store, since, until, instances) if span is not None else pd.DataFrame()
    if not sums.empty:
        table = shortfall_of_sums(sums, "instance")
    else:
        requests = store.reads.requests(since, until, instances=instances)
        lookups, _ = store_lookups(store, requests, store.reads.steps(since, until), since, until)
        if lookups.empty:
            return tax_table(shortfall(lookups, "instance", total=None), "instance", {})
        table = shortfall(lookups, "instance")
    return shortfall_tax(store, since, until, table)


def shortfall_tax(store, since, until, table: pd.DataFrame) -> pd.DataFrame:
    """The tax of a shortfall table per instance and fleet (`shortfall_split.shortfall`'s) of [since, until], with the
    range's preemptions read from `store`."""
    preempted = range_preemptions(store, since, until)
    return tax_table(table, "instance", preempted.by("instance", table["instance"][table["instance"] != FLEET]))
