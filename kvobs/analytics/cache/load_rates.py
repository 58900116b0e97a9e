"""Each instance's measured cost of loading a prefix back from a tier below its cache: seconds per loaded token, from
its own counters over the `LOAD_WINDOW_S` around a moment. What turns "3 blocks loaded back from the offload tier"
into "about 0.004 s to load them".

    loads = LoadRates.from_store(store, since, until)
    rate = loads.at("eng", ts)     # LoadRate(tokens_per_s=..., tokens=..., seconds=...) or None
    rate.seconds(48)               # what loading 48 tokens cost there

Read as the engine counts them: vLLM's offloading connector (and `kvobs serve`'s tier) times its loads in
`vllm:kv_offload_load_time` and counts the tokens they gave in `vllm:external_prefix_cache_hits`; LMCache times its
retrievals in `lmcache:time_to_retrieve` and counts their tokens in `lmcache:num_hit_tokens`. The window is around the
moment, not before it: a load is counted by the scrape after it. No loads counted in the window: no rate (None),
and no load time is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.semconv.engine_metrics import lmcache
from kvobs.semconv.metrics import INCREASE_SUFFIX, SUM_SUFFIX, vllm

LOAD_WINDOW_S = 600.0  # either side of the moment: loads are rarer than prefills, and counted after they happen
# (seconds, tokens) counter pairs, the first an engine has wins
PAIRS = (
    (vllm.KV_OFFLOAD_LOAD_TIME.name + INCREASE_SUFFIX, vllm.EXTERNAL_PREFIX_CACHE_HITS.name + INCREASE_SUFFIX),
    (lmcache.TIME_TO_RETRIEVE.name + SUM_SUFFIX, lmcache.NUM_HIT_TOKENS.name + INCREASE_SUFFIX),
)
NAMES = [name for pair in PAIRS for name in pair]


@dataclass(frozen=True)
class LoadRate:
    tokens_per_s: float
    tokens: float  # the loaded tokens it was measured over
    counted_by: str  # the seconds' counter

    def seconds(self, tokens: float) -> float:
        return tokens / self.tokens_per_s

    def describe(self, instance: str) -> str:
        return (
            f"{self.tokens_per_s:,.0f} tokens/s ({instance}'s loads, {self.counted_by} over the {self.tokens:,.0f} "
            f"tokens loaded within {LOAD_WINDOW_S / 60:g} minutes of it)"
        )


class LoadRates:
    """Per instance, its load rate around any moment (see the module's doc)."""

    def __init__(self, counters: pd.DataFrame | None = None) -> None:
        self._series: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, str]] = {}
        if counters is None or counters.empty:
            return
        for instance, group in counters.groupby("instance"):
            wide = group.pivot_table(index="ts", columns="name", values="value", aggfunc="sum", fill_value=0.0)
            for seconds, tokens in PAIRS:
                if {seconds, tokens} <= set(wide.columns) and wide[seconds].sum() > 0:
                    cum = (np.concatenate([[0.0], np.cumsum(wide[c].to_numpy(float))]) for c in (seconds, tokens))
                    self._series[str(instance)] = (wide.index.to_numpy(float), *cum, seconds.rsplit(":", 1)[0])
                    break

    @classmethod
    def from_store(cls, store, since, until) -> LoadRates:
        return cls(store.reads.metric_series(NAMES, since, until))

    def at(self, instance, ts: float) -> LoadRate | None:
        series = self._series.get(instance)
        if series is None or ts != ts:
            return None
        times, seconds, tokens, counted_by = series
        low, high = np.searchsorted(times, [ts - LOAD_WINDOW_S, ts + LOAD_WINDOW_S], side="right")
        s, t = float(seconds[high] - seconds[low]), float(tokens[high] - tokens[low])
        if s <= 0 or t <= 0:
            return None
        return LoadRate(t / s, t, counted_by)
