"""The Overview's "Hits by tier": where each replica's prompt tokens came from, by its engine's own counters
(`kvobs.analytics.cache.hits_by_tier`): its device cache, a tier below it, or computed; and each tier's lookups where
the engine counts them in blocks or chunks (`kvobs.analytics.cache.lookups_by_tier`)."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.tables import show_table


def render_tier_hits(ctx) -> None:
    st.subheader("Hits by tier")
    table = _mine(ctx, cache.tier_hits(ctx.url, ctx.since, ctx.until))
    if table.empty:
        st.info(
            "No engine counted its prompt tokens by source in this range: vLLM's and kvobs serve's "
            "`vllm:prompt_tokens_by_source` (from vLLM 0.34 also `vllm:prompt_tokens_cached_by_source`), SGLang's "
            "`sglang:cached_tokens{cache_source}`, TensorRT-LLM's "
            "`trtllm_prompt_cache_hit_tokens{cache_level}`, scraped from their /metrics."
        )
    else:
        st.caption(
            f"{ctx.scope().capitalize()}, from each engine's own counters, as it counted them: every prompt token "
            "found in the device cache, loaded from a tier below it, or computed. A blank: the engine did not say "
            "(SGLang counting cached tokens without their source, TensorRT-LLM without its iteration stats; computed "
            "tokens where a range cut a request between its admission and its finish; load times where the "
            "connector does not count them)."
        )
        show_table(table, ctx.clock)
    lookups = _mine(ctx, cache.tier_lookups(ctx.url, ctx.since, ctx.until))
    if not lookups.empty:
        st.caption(
            "Each tier's lookups, in the unit its engine counts them (vLLM's tiering manager: offload chunks, a "
            "secondary tier asked only after the primary missed; TensorRT-LLM: blocks over all its cache levels)."
        )
        show_table(lookups, ctx.clock)


def _mine(ctx, table):
    """The table's rows of the instances in view."""
    return table[table["instance"].isin(ctx.instances)] if ctx.instances is not None and not table.empty else table
