"""Is a replica's offload tier doing anything, and do its KV events say so? (`kvobs doctor`)

    for check in tier_checks(store, since, until):
        print(check.instance, check.ok, check.words)

Read from the replica's own scraped counters (vLLM's offloading connector's, or `kvobs serve --kv-offloading-size`'s)
and the tier's KV events in the store, for every replica whose tier stored anything in the range:
- "tier stored but never hit": bytes went into the tier (`vllm:kv_offload_store_bytes`) and none came back
  (`vllm:kv_offload_load_bytes`, `vllm:external_prefix_cache_hits` flat): the tier costs copies and saves nothing;
- "tier events missing": the tier stored bytes, and no `tier_stored` event (self-describing, or a placeholder) came
  from that replica: its connector's KV events are off, so no page can say what the tier holds.
A replica whose counters say nothing of a tier is not checked (no tier, or no scrape: nothing to say).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store

STORE_BYTES = vllm.KV_OFFLOAD_STORE_BYTES.name + INCREASE_SUFFIX
LOAD_BYTES = vllm.KV_OFFLOAD_LOAD_BYTES.name + INCREASE_SUFFIX
EXTERNAL_HITS = vllm.EXTERNAL_PREFIX_CACHE_HITS.name + INCREASE_SUFFIX


@dataclass(frozen=True)
class TierCheck:
    instance: str
    ok: bool
    words: str


def tier_checks(store: Store, since: float | None = None, until: float | None = None) -> list[TierCheck]:
    """Per replica whose offload tier stored bytes in the range, whether it was hit and whether its events came."""
    series = store.reads.metric_series([STORE_BYTES, LOAD_BYTES, EXTERNAL_HITS], since, until)
    if series.empty:
        return []
    totals = series.groupby(["instance", "name"])["value"].sum()
    stored = totals.xs(STORE_BYTES, level="name") if STORE_BYTES in totals.index.get_level_values("name") else None
    if stored is None or not (stored > 0).any():
        return []
    counts = store.reads.kv_event_counts(
        since, until, kinds=[KVEventKind.TIER_STORED.value], bucket_s=3600.0, by_instance=True
    )
    events = counts.groupby("instance")["events"].sum() if not counts.empty else {}
    out = []
    for instance, stored_bytes in stored[stored > 0].items():
        loaded = float(totals.get((instance, LOAD_BYTES), 0.0))
        hits = totals.get((instance, EXTERNAL_HITS))
        said = f"its offload tier stored {stored_bytes:,.0f} bytes"
        if not int(events.get(instance, 0)):
            out.append(
                TierCheck(
                    instance,
                    False,
                    f"tier events missing: {said} (vllm:kv_offload_store_bytes) and no tier event came from it: its "
                    "connector's KV events are off (on with --kv-events-config; placeholders count too), so no "
                    "page can say what the tier held",
                )
            )
        if loaded <= 0 and not hits:
            out.append(
                TierCheck(
                    instance,
                    False,
                    f"tier stored but never hit: {said} and loaded nothing back (vllm:kv_offload_load_bytes 0"
                    + ("" if hits is None else ", vllm:external_prefix_cache_hits 0")
                    + "): every prefix was in the cache or in neither (a tier too small for the pauses, or prefixes "
                    "that do not come back)",
                )
            )
        elif int(events.get(instance, 0)):
            words = f"offload tier: {stored_bytes:,.0f} bytes stored, {loaded:,.0f} loaded back"
            out.append(TierCheck(instance, True, words + ("" if hits is None else f" ({hits:,.0f} tokens hit)")))
    return out
