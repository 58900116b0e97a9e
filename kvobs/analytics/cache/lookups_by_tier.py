"""Each tier's lookups as its engine counts them, in the engine's own unit (blocks or chunks): how many it was asked
for and how many it found; beside the hits by tier, which count prompt tokens (`kvobs.analytics.cache.hits_by_tier`).

    table = tier_lookups(store, since, until)   # one row per replica and tier whose lookups its engine counts

- vLLM's tiering offload manager (a primary tier in host memory and secondary tiers under it):
  `vllm:kv_offload_tiering_chunk_queries{tier}` and `..._hits{tier}`, in offload chunks. `0:primary` is its primary
  tier (kvobs's `CPU`); each secondary tier is `N:<its type>` in its order (`1:fs`) and is asked only after the
  primary missed, so its queries are the primary's misses that reached it. vLLM counts a chunk once per request
  until the request is allocated.
- TensorRT-LLM: `trtllm_kv_cache_reused_blocks` and `trtllm_kv_cache_missed_blocks` (its iteration stats), in
  blocks, over all its cache levels: asked = reused + missed. Each series shows at its first increment, so one the
  other has without it counted none yet.
A replica whose engine counts none has no row: no engine spoke, not zero lookups.
"""

from __future__ import annotations

import pandas as pd

from kvobs.analytics.cache.hits_by_tier import by_label, named_total
from kvobs.semconv.engine_metrics import trtllm
from kvobs.semconv.metrics import INCREASE_SUFFIX, LABEL_TIER, vllm
from kvobs.store.interface import Store

CHUNK_QUERIES = vllm.KV_OFFLOAD_TIERING_CHUNK_QUERIES.name + INCREASE_SUFFIX
CHUNK_HITS = vllm.KV_OFFLOAD_TIERING_CHUNK_HITS.name + INCREASE_SUFFIX
REUSED_BLOCKS = trtllm.KV_CACHE_REUSED_BLOCKS.name + INCREASE_SUFFIX
MISSED_BLOCKS = trtllm.KV_CACHE_MISSED_BLOCKS.name + INCREASE_SUFFIX
ALL_LEVELS = "all levels"  # TensorRT-LLM's block counters do not say a level

LOOKUP_COLUMNS = [
    "instance",
    "tier",  # as the engine names it
    "counted_by",
    "unit",  # chunks | blocks
    "asked",  # lookups the tier answered
    "found",
    "found_share",  # found / asked (NaN: none asked)
]


def tier_lookups(store: Store, since: float | None = None, until: float | None = None) -> pd.DataFrame:
    """Per replica and tier whose lookups its engine counts in the range: the columns `LOOKUP_COLUMNS`."""
    series = store.reads.metric_series([CHUNK_QUERIES, CHUNK_HITS, REUSED_BLOCKS, MISSED_BLOCKS], since, until)
    rows = []
    for instance, samples in series.groupby("instance", sort=True):
        rows += [{"instance": instance, **row} for row in (*_vllm(samples), *_trtllm(samples))]
    table = pd.DataFrame(rows, columns=LOOKUP_COLUMNS)
    shares = [found / asked if asked else float("nan") for found, asked in zip(table.found, table.asked)]
    return table.assign(found_share=pd.Series(shares, index=table.index, dtype=float))


def _vllm(samples: pd.DataFrame) -> list[dict]:
    asked = by_label(samples[samples["name"] == CHUNK_QUERIES], LABEL_TIER)
    found = by_label(samples[samples["name"] == CHUNK_HITS], LABEL_TIER)
    counted_by = f"{vllm.KV_OFFLOAD_TIERING_CHUNK_QUERIES.name}, {vllm.KV_OFFLOAD_TIERING_CHUNK_HITS.name}"
    return [
        {"tier": tier, "counted_by": counted_by, "unit": "chunks", "asked": asked[tier], "found": found.get(tier, 0.0)}
        for tier in sorted(asked)  # (a hit is a query answered: no tier has hits without queries)
    ]


def _trtllm(samples: pd.DataFrame) -> list[dict]:
    reused, missed = named_total(samples, REUSED_BLOCKS), named_total(samples, MISSED_BLOCKS)
    if reused is None and missed is None:
        return []
    reused, missed = reused or 0.0, missed or 0.0  # (the other's series not shown yet: none counted)
    counted_by = f"{trtllm.KV_CACHE_REUSED_BLOCKS.name}, {trtllm.KV_CACHE_MISSED_BLOCKS.name}"
    return [{"tier": ALL_LEVELS, "counted_by": counted_by, "unit": "blocks", "asked": reused + missed, "found": reused}]
