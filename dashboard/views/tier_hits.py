"""The Overview's "Hits by tier": where each replica's prompt tokens came from, by its engine's own counters
(`kvobs.analytics.tier_hits`): its device cache, a tier below it, or computed."""

from __future__ import annotations

import streamlit as st

from dashboard.views import cache
from dashboard.views.tables import show_table
from kvobs.analytics.tier_hits import BLOCK_COUNTS


def render_tier_hits(ctx) -> None:
    st.subheader("Hits by tier")
    table = cache.tier_hits(ctx.url, ctx.since, ctx.until)
    if ctx.instances is not None and not table.empty:
        table = table[table["instance"].isin(ctx.instances)]
    if table.empty:
        st.info(
            "No engine counted its prompt tokens by source in this range: vLLM's and kvobs serve's "
            "vllm:prompt_tokens_by_source, SGLang's sglang:cached_tokens{cache_source}, TensorRT-LLM's "
            "trtllm_prompt_cache_hit_tokens{cache_level} or its block counters trtllm_kv_cache_{reused,missed}_blocks, "
            "scraped from their /metrics."
        )
        return
    st.caption(
        f"{ctx.scope().capitalize()}, from each engine's own counters, as it counted them: every prompt token found "
        "in the device cache, loaded from a tier below it, or computed. A blank: the engine did not say (SGLang "
        "counting cached tokens without their source, TensorRT-LLM without its iteration stats; computed tokens "
        "where a range cut a request between its admission and its finish; load times where the connector does not "
        "count them). Reused and missed blocks: blocks, where the engine counts its lookups in blocks (TensorRT-LLM)."
    )
    counted = [c for c in BLOCK_COUNTS if table[c].notna().any()]  # (block columns only where an engine said them)
    show_table(table.drop(columns=[c for c in BLOCK_COUNTS if c not in counted]), ctx.clock)
