"""Where each replica's prompt tokens came from, by tier, read from the engine's own counters (`tier_hits`): found in
its device cache, loaded from a tier below it (an offload tier, LMCache, HiCache's host or storage tier), or
computed; and the seconds its loads took where the engine counts them.

    table = tier_hits(store, since, until)     # one row per replica whose engine counts its prompt tokens by source,
                                               # then the fleet's (their sums) where there are two or more

Each engine says it in its own words, read as it defines them:
- vLLM (and `kvobs serve`): `vllm:prompt_tokens_by_source{source}` splits every prompt token into
  `local_cache_hit`, `external_kv_transfer` (its KV connector: the offloading connector's tier, LMCache) and
  `local_compute`; the loads' seconds are `vllm:kv_offload_load_time` (the offloading connector), else LMCache's
  `lmcache:time_to_retrieve` sum where one worker counted it (with several, each timed its own shard: not said).
  From vLLM 0.34, `vllm:prompt_tokens_cached_by_source{source}` says which tier the connector's tokens came from
  (`host`: kvobs's CPU, `disk`, `p2p`: another vLLM instance, `external_unspecified`: not said); before it, or where
  it says `external_unspecified`, the tier is named by whose counters came with them: LMCache, the offloading
  connector (`vllm:kv_offload_*`), else the KV connector.
- SGLang: `sglang:cached_tokens{cache_source}` (`device`: its radix cache; `host`: HiCache's CPU tier;
  `storage`: its storage tier) against `sglang:prompt_tokens`. Tokens counted as `total` (a request whose sources
  were not given), or with no `cache_source` (releases before the split), say how many were cached, not where: the
  split is then not measured (None), never guessed.
- TensorRT-LLM: `trtllm_prompt_cache_hit_tokens{cache_level,cache_tier}` (level 0: the primary pool; each level
  below it by the memory backing it: `host` is kvobs's CPU, `disk` DISK, a cold `gpu` level "GPU level N") against
  `trtllm_prompt_tokens`. It counts a request's cached tokens as it is admitted and its prompt tokens when it
  finishes, so a range that cuts a request between the two can hold more cached tokens than prompt tokens: its
  computed tokens are then not said. Without its iteration stats it counts only `trtllm_prompt_cached_tokens`: how
  many, not from which level (not split); a revision that counts neither, its prompt tokens alone. It counts no load
  time. What it counts in blocks (reused and missed) is `tier_lookups`'.
A replica whose counters say none of this has no row: no engine spoke, not zero hits.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd

from kvobs.analytics.cache.routing import FLEET
from kvobs.semconv.attributes import MEDIUM_CPU, MEDIUM_GPU, medium_name
from kvobs.semconv.engine_metrics import (
    CACHE_SOURCE_DEVICE,
    CACHE_SOURCE_HOST,
    CACHE_SOURCE_TOTAL,
    LABEL_CACHE_LEVEL,
    LABEL_CACHE_SOURCE,
    LABEL_CACHE_TIER,
    LABEL_WORKER_ID,
    PRIMARY_CACHE_LEVEL,
    lmcache,
    sglang,
    storage_source,
    trtllm,
)
from kvobs.semconv.metrics import INCREASE_SUFFIX, SUM_SUFFIX, vllm
from kvobs.semconv.vllm_metrics import (
    CACHED_SOURCE_DEVICE,
    CACHED_SOURCE_DISK,
    CACHED_SOURCE_HOST,
    CACHED_SOURCE_P2P,
    LABEL_SOURCE,
    PROMPT_SOURCE_CACHED,
    PROMPT_SOURCE_COMPUTED,
    PROMPT_SOURCE_EXTERNAL,
)
from kvobs.store.interface import Store

BY_SOURCE = vllm.PROMPT_TOKENS_BY_SOURCE.name + INCREASE_SUFFIX
CACHED_BY_SOURCE = vllm.PROMPT_TOKENS_CACHED_BY_SOURCE.name + INCREASE_SUFFIX
OFFLOAD_LOAD_S = vllm.KV_OFFLOAD_LOAD_TIME.name + INCREASE_SUFFIX
LMCACHE_HITS = lmcache.NUM_HIT_TOKENS.name + INCREASE_SUFFIX
LMCACHE_RETRIEVE_S = lmcache.TIME_TO_RETRIEVE.name + SUM_SUFFIX
SGLANG_PROMPT = sglang.PROMPT_TOKENS.name + INCREASE_SUFFIX
SGLANG_CACHED = sglang.CACHED_TOKENS.name + INCREASE_SUFFIX
TRTLLM_PROMPT = trtllm.PROMPT_TOKENS.name + INCREASE_SUFFIX
TRTLLM_CACHED = trtllm.PROMPT_CACHED_TOKENS.name + INCREASE_SUFFIX
TRTLLM_BY_LEVEL = trtllm.PROMPT_CACHE_HIT_TOKENS.name + INCREASE_SUFFIX
STORAGE = str(medium_name("storage"))  # HiCache's storage tier, under kvobs's one name for it
# vLLM 0.34's cache-hit sources below its device cache, by kvobs's name for the tier (`external_unspecified`: the
# KV connector's, named as `_connector` names it)
VLLM_SOURCE_TIERS = {
    CACHED_SOURCE_HOST: MEDIUM_CPU,
    CACHED_SOURCE_DISK: str(medium_name("disk")),
    CACHED_SOURCE_P2P: "P2P",
}
NAMES = [
    BY_SOURCE,
    CACHED_BY_SOURCE,
    OFFLOAD_LOAD_S,
    LMCACHE_HITS,
    LMCACHE_RETRIEVE_S,
    SGLANG_PROMPT,
    SGLANG_CACHED,
    TRTLLM_PROMPT,
    TRTLLM_CACHED,
    TRTLLM_BY_LEVEL,
]

TIER_HIT_COLUMNS = [
    "instance",
    "counted_by",  # the engine counters the row is read from
    "prompt_tokens",
    "cache_tokens",  # found in the device cache
    "loaded_tokens",  # loaded from the tiers below it
    "tiers",  # which tiers those were, as the engine names them
    "tokens_by_tier",  # the loaded tokens by tier, where the engine counts them so ("": it does not)
    "computed_tokens",
    "loaded_share",  # loaded_tokens / prompt_tokens (NaN: not split)
    "load_s",  # the loads' seconds, as the engine counted them (None: not counted)
]


def tier_hits(store: Store, since: float | None = None, until: float | None = None) -> pd.DataFrame:
    """Per replica whose engine counts its prompt tokens by source in the range: the columns `TIER_HIT_COLUMNS`."""
    series = store.reads.metric_series(NAMES, since, until)
    if series.empty:
        return pd.DataFrame(columns=TIER_HIT_COLUMNS)
    rows = []
    for instance, samples in series.groupby("instance", sort=True):
        row = _vllm(samples) or _sglang(samples) or _trtllm(samples)
        if row is not None:
            rows.append({"instance": instance, **row})
    if len(rows) > 1:
        rows.append(_fleet(rows))
    for row in rows:
        row["tokens_by_tier"] = _by_tier_words(row.pop("by_tier"))
    table = pd.DataFrame(rows, columns=TIER_HIT_COLUMNS)
    pairs = zip(table.loaded_tokens, table.prompt_tokens)
    shares = [t / p if p and t is not None and t == t else np.nan for t, p in pairs]
    return table.assign(loaded_share=np.array(shares, dtype=float))


def _fleet(rows: list[dict]) -> dict:
    """The replicas' rows summed: a count one replica did not say (None) leaves the fleet's unsaid too."""
    out: dict = {"instance": FLEET, "counted_by": "", "tiers": ", ".join(sorted({r["tiers"] for r in rows} - {""}))}
    for column in ("prompt_tokens", "cache_tokens", "loaded_tokens", "computed_tokens", "load_s"):
        values = [r[column] for r in rows]
        out[column] = None if any(v is None for v in values) else float(sum(values))
    out["by_tier"] = None
    if all(r["by_tier"] is not None for r in rows):
        summed: dict[str, float] = defaultdict(float)
        for r in rows:
            for tier, n in r["by_tier"].items():
                summed[tier] += n
        out["by_tier"] = dict(summed)
    return out


def _by_tier_words(by_tier: dict[str, float] | None) -> str:
    """The loaded tokens by tier, most first ("": not counted by tier, or none loaded)."""
    if not by_tier:
        return ""
    return ", ".join(f"{tier} {n:,.0f}" for tier, n in sorted(by_tier.items(), key=lambda item: (-item[1], item[0])))


def by_labels(samples: pd.DataFrame, *names: str) -> dict[tuple[str, ...], float]:
    """The samples' values summed per values of the labels `names` ('' where a sample has one not)."""
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in zip(samples["labels"], samples["value"]):
        out[tuple(str((labels or {}).get(name, "")) for name in names)] += float(value)
    return out


def by_label(samples: pd.DataFrame, name: str) -> dict[str, float]:
    """The samples' values summed per value of the label `name`."""
    return {value: n for (value,), n in by_labels(samples, name).items()}


def named_total(samples: pd.DataFrame, name: str) -> float | None:
    """The samples of `name` summed (None: none came)."""
    values = samples.loc[samples["name"] == name, "value"]
    return float(values.sum()) if len(values) else None


def _vllm(samples: pd.DataFrame) -> dict | None:
    mine = samples[samples["name"] == BY_SOURCE]
    if mine.empty:
        return None
    sources = by_label(mine, LABEL_SOURCE)
    cache, tier, computed = (
        sources.get(s, 0.0) for s in (PROMPT_SOURCE_CACHED, PROMPT_SOURCE_EXTERNAL, PROMPT_SOURCE_COMPUTED)
    )
    lmcache_hits = samples[samples["name"] == LMCACHE_HITS]
    load_s = offload_s = named_total(samples, OFFLOAD_LOAD_S)
    if load_s is None and len(by_label(lmcache_hits, LABEL_WORKER_ID)) == 1:
        # (with several workers, each times its own shard's retrieval: their sum is no wall time)
        load_s = named_total(samples, LMCACHE_RETRIEVE_S)
    connector = _connector(not lmcache_hits.empty, offload_s is not None)
    counted_by = vllm.PROMPT_TOKENS_BY_SOURCE.name
    by_tier: dict[str, float] = {connector: tier} if tier else {}
    sources = by_label(samples[samples["name"] == CACHED_BY_SOURCE], LABEL_SOURCE)
    if any(n for source, n in sources.items() if source != CACHED_SOURCE_DEVICE):  # (vLLM 0.34: by the tier)
        counted_by += f", {vllm.PROMPT_TOKENS_CACHED_BY_SOURCE.name}{{source}}"
        by_tier = defaultdict(float)
        for source, n in sources.items():
            if source != CACHED_SOURCE_DEVICE and n:
                by_tier[VLLM_SOURCE_TIERS.get(source, connector)] += n
    return {
        "counted_by": counted_by,
        "prompt_tokens": cache + tier + computed,
        "cache_tokens": cache,
        "loaded_tokens": tier,
        "tiers": ", ".join(sorted(by_tier)),
        "by_tier": dict(by_tier),
        "computed_tokens": computed,
        "load_s": load_s,
    }


def _connector(lmcache_counted: bool, offload_counted: bool) -> str:
    """The KV connector vLLM's `external_kv_transfer` tokens came through, by whose counters came with them."""
    return "LMCache" if lmcache_counted else "offloading connector" if offload_counted else "KV connector"


def _sglang(samples: pd.DataFrame) -> dict | None:
    prompt = named_total(samples, SGLANG_PROMPT)
    cached = samples[samples["name"] == SGLANG_CACHED]
    if prompt is None and cached.empty:
        return None
    sources = by_label(cached, LABEL_CACHE_SOURCE)
    total_cached = sum(sources.values())
    split = not {"", CACHE_SOURCE_TOTAL} & {s for s, n in sources.items() if n}  # every cached token said where
    lower = [s for s in sources if s not in ("", CACHE_SOURCE_TOTAL, CACHE_SOURCE_DEVICE) and sources[s]]
    by_tier: dict[str, float] = defaultdict(float)
    for s in lower:
        by_tier[MEDIUM_CPU if s == CACHE_SOURCE_HOST else STORAGE if storage_source(s) else s.upper()] += sources[s]
    cache = sources.get(CACHE_SOURCE_DEVICE, 0.0) if split else None
    return {
        "counted_by": sglang.CACHED_TOKENS.name + ("{cache_source}" if split else " (sources not given: not split)"),
        "prompt_tokens": prompt,
        "cache_tokens": cache,
        "loaded_tokens": None if cache is None else total_cached - cache,
        "tiers": ", ".join(sorted(by_tier)),
        "by_tier": dict(by_tier) if split else None,
        "computed_tokens": prompt - total_cached if prompt is not None else None,
        "load_s": None,
    }


def _trtllm(samples: pd.DataFrame) -> dict | None:
    prompt = named_total(samples, TRTLLM_PROMPT)
    # (cache level, its tier) -> tokens found there
    levels = by_labels(samples[samples["name"] == TRTLLM_BY_LEVEL], LABEL_CACHE_LEVEL, LABEL_CACHE_TIER)
    cached = sum(levels.values()) if levels else named_total(samples, TRTLLM_CACHED)
    if prompt is None and cached is None:
        return None
    cache = loaded = None
    by_tier: dict[str, float] | None = None
    if levels:
        cache = sum(n for (level, _), n in levels.items() if level == PRIMARY_CACHE_LEVEL)
        loaded = sum(n for (level, _), n in levels.items() if level != PRIMARY_CACHE_LEVEL)
        by_tier = {}
        for (level, tier), n in levels.items():
            if level != PRIMARY_CACHE_LEVEL and n:
                name = _level_name(level, tier)
                by_tier[name] = by_tier.get(name, 0.0) + n
    # (cached tokens are counted as a request is admitted, its prompt tokens as it finishes: a range can cut between)
    computed = prompt - cached if prompt is not None and cached is not None and prompt >= cached else None
    if levels:
        counted_by = trtllm.PROMPT_CACHE_HIT_TOKENS.name + "{cache_level}"
    elif cached is not None:
        counted_by = trtllm.PROMPT_CACHED_TOKENS.name + " (levels not counted: not split)"
    else:
        counted_by = trtllm.PROMPT_TOKENS.name + " (cached tokens not counted: not split)"
    return {
        "counted_by": counted_by,
        "prompt_tokens": prompt,
        "cache_tokens": cache,
        "loaded_tokens": loaded,
        "tiers": ", ".join(sorted(by_tier or ())),
        "by_tier": by_tier,
        "computed_tokens": computed,
        "load_s": None,
    }


def _level_name(level: str, tier: str) -> str:
    """A TensorRT-LLM cache level below the primary, by kvobs's name for its memory (`host`: CPU); a cold GPU level,
    or one whose memory is not named, by its index too."""
    name = medium_name(tier) if tier else None
    return f"{name or ''} level {level}".strip() if name in (None, MEDIUM_GPU) else str(name)
