"""What-if's "CPU tier or more cache": the same blocks added to an offload tier below each run's cache, or to the
cache itself (`dashboard.whatif_data.tier_sweep`, `kvobs whatif --tier-blocks`)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import show
from dashboard.views.tables import show_text_table
from dashboard.whatif_data import TierSweep, tier_sweep


@st.cache_data(ttl=60, show_spinner="Replaying with an offload tier...")
def sweep(url, since, until, instances, extra: tuple[int, ...], _iso) -> TierSweep:
    """`dashboard.whatif_data.tier_sweep` over the page's plans (`_iso`, how the page writes a time, is left out of
    the cache's key: one per page)."""
    return tier_sweep(cache.get_store(url), cache.replay_plans(url, since, until, instances), extra, _iso)


def render(ctx, observed: int | None) -> None:
    """CPU tier or more cache (`kvobs whatif --tier-blocks`): the same blocks added to an offload tier below each
    run's cache, or to the cache itself."""
    st.subheader("CPU tier or more cache")
    extra = tuple(sorted({max(1, observed // 2), observed, observed * 2})) if observed else (16, 32, 64)
    try:
        done = sweep(ctx.url, ctx.since, ctx.until, ctx.instances, extra, ctx.clock.iso)
    except ValueError as exc:
        st.info(str(exc))
        return
    if done.left_out:
        st.warning("Left out of the sweep: " + done.left_out + ".")
    table = done.table
    _sweep_chart(table)
    shown = table.assign(**{"recompute (s)": table["recompute (s)"].map(lambda s: "not measured" if pd.isna(s) else s)})
    show_text_table(shown, ctx.clock)
    st.caption(done.legend)


def _sweep_chart(table: pd.DataFrame) -> None:
    """Tool-pause losses and recomputed tokens by blocks added, a line for the tier and one for the cache (each
    from the observed setup at 0)."""
    base = table[table["added"] == "none"]
    lines = pd.concat(
        [
            pd.concat([base.assign(added=kind), table[table["added"] == kind]])
            for kind in ("offload tier", "bigger cache")
        ]
    )
    charts = [
        alt.Chart(lines)
        .mark_line(point=True)
        .encode(
            x=alt.X("blocks added:Q", title="blocks added"),
            y=alt.Y(f"{measure}:Q", title=measure + unit),
            color=alt.Color("added:N", title="added to"),
            tooltip=["added", "blocks added", alt.Tooltip(f"{measure}:Q", format=",d")],
        )
        .properties(height=220, width=330)
        for measure, unit in (("lost in tool pauses", " (blocks)"), ("recomputed tokens", ""))
    ]
    show(alt.hconcat(*charts), width="content")
