"""Is a replica's offload tier doing anything, and do its KV events say so? (`kvobs doctor`)

    for check in tier_checks(store, since, until):
        print(check.instance, check.ok, check.words)

Read from the replica's own scraped counters and the tier's KV events in the store, for every replica whose tier
stored anything in the range. The counters are each engine's (`TIER_COUNTERS`): vLLM's offloading connector's (and
`kvobs serve --kv-offloading-size`'s), `vllm:kv_offload_{store,load}_bytes`; TensorRT-LLM's host pool's,
`trtllm_kv_cache_{offload,onboard}_bytes`.
- "tier stored but never hit": bytes went into the tier and none came back (for vLLM,
  `vllm:external_prefix_cache_hits` flat too): the tier costs copies and saves nothing;
- "tier events missing": the tier stored bytes, and no `tier_stored` event (self-describing, a placeholder, or
  TensorRT-LLM's move of a block to its host pool) came from that replica: its KV events of the tier do not reach
  kvobs, so no page can say what the tier holds.
A replica whose counters say nothing of a tier is not checked (no tier, or no scrape: nothing to say).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvobs.semconv.engine_metrics import trtllm
from kvobs.semconv.metrics import INCREASE_SUFFIX, vllm
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store


@dataclass(frozen=True)
class TierCounters:
    """One engine's counters of its offload tier: bytes stored into it, bytes loaded back, tokens hit (None: not
    counted), and how its tier's KV events are switched on."""

    stored: str
    loaded: str
    hits: str | None
    events_on: str

    def names(self) -> list[str]:
        return [self.stored, self.loaded, *([self.hits] if self.hits else [])]


TIER_COUNTERS = (
    TierCounters(
        vllm.KV_OFFLOAD_STORE_BYTES.name,
        vllm.KV_OFFLOAD_LOAD_BYTES.name,
        vllm.EXTERNAL_PREFIX_CACHE_HITS.name,
        "its connector's KV events are off (on with --kv-events-config; placeholders count too)",
    ),
    TierCounters(
        trtllm.KV_CACHE_OFFLOAD_BYTES.name,
        trtllm.KV_CACHE_ONBOARD_BYTES.name,
        None,
        "its KV-cache events are not fetched (give the server's URL as a --kv-events endpoint; they are kept with "
        "event_buffer_max_size in its kv_cache_config)",
    ),
)


@dataclass(frozen=True)
class TierCheck:
    instance: str
    ok: bool
    words: str


def tier_checks(store: Store, since: float | None = None, until: float | None = None) -> list[TierCheck]:
    """Per replica whose offload tier stored bytes in the range, whether it was hit and whether its events came."""
    names = [name + INCREASE_SUFFIX for counters in TIER_COUNTERS for name in counters.names()]
    series = store.reads.metric_series(names, since, until)
    if series.empty:
        return []
    totals = series.groupby(["instance", "name"])["value"].sum()
    stored = {
        (instance, counters): float(value)
        for (instance, name), value in totals.items()
        for counters in TIER_COUNTERS
        if name == counters.stored + INCREASE_SUFFIX and value > 0
    }
    if not stored:
        return []
    counts = store.reads.kv_event_counts(
        since, until, kinds=[KVEventKind.TIER_STORED.value], bucket_s=3600.0, by_instance=True
    )
    events = counts.groupby("instance")["events"].sum() if not counts.empty else {}
    out = []
    for (instance, counters), stored_bytes in sorted(stored.items(), key=lambda item: item[0][0]):
        out += _check(instance, counters, stored_bytes, totals, int(events.get(instance, 0)))
    return out


def _check(instance: str, counters: TierCounters, stored_bytes: float, totals, events: int) -> list[TierCheck]:
    loaded = float(totals.get((instance, counters.loaded + INCREASE_SUFFIX), 0.0))
    hits = totals.get((instance, counters.hits + INCREASE_SUFFIX)) if counters.hits else None
    said = f"its offload tier stored {stored_bytes:,.0f} bytes"
    out = []
    if not events:
        words = f"tier events missing: {said} ({counters.stored}) and no tier event came from it: "
        out.append(TierCheck(instance, False, words + counters.events_on + ", so no page can say what the tier held"))
    if loaded <= 0 and not hits:
        out.append(
            TierCheck(
                instance,
                False,
                f"tier stored but never hit: {said} and loaded nothing back ({counters.loaded} 0"
                + ("" if hits is None else f", {counters.hits} 0")
                + "): every prefix was in the cache or in neither (a tier too small for the pauses, or prefixes "
                "that do not come back)",
            )
        )
    elif events:
        words = f"offload tier: {stored_bytes:,.0f} bytes stored, {loaded:,.0f} loaded back"
        out.append(TierCheck(instance, True, words + ("" if hits is None else f" ({hits:,.0f} tokens hit)")))
    return out
