"""What-if's "CPU tier or more cache": the same blocks added to an offload tier below each run's cache, or to the
cache itself (`instrumented_engine.whatif.tier_sweep`, `kvobs whatif --tier-blocks`)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard.views import cache
from dashboard.views.charts import show
from dashboard.views.tables import show_text_table


@st.cache_data(ttl=60, show_spinner="Replaying with an offload tier...")
def sweep(url, since, until, instances, extra: tuple[int, ...]) -> tuple[pd.DataFrame, list]:
    """`whatif.tier_sweep`'s rows (the observed setup, then each number of blocks added to a tier or the cache) and
    the runs it left out, with why."""
    from instrumented_engine.whatif.tier_sweep import SWEEP_COLUMNS, tier_sweep

    rows, left_out = tier_sweep(cache.replay_plans(url, since, until, instances), cache.get_store(url), extra)
    return pd.DataFrame(rows, columns=list(SWEEP_COLUMNS)), left_out


def render(ctx, observed: int | None) -> None:
    """CPU tier or more cache (`kvobs whatif --tier-blocks`): the same blocks added to an offload tier below each
    run's cache, or to the cache itself."""
    from instrumented_engine.whatif.tier_sweep import SWEEP_LEGEND, describe_left_out

    st.subheader("CPU tier or more cache")
    extra = tuple(sorted({max(1, observed // 2), observed, observed * 2})) if observed else (16, 32, 64)
    try:
        table, left_out = sweep(ctx.url, ctx.since, ctx.until, ctx.instances, extra)
    except ValueError as exc:
        st.info(str(exc))
        return
    if left_out:
        st.warning("Left out of the sweep: " + describe_left_out(left_out, ctx.clock.iso) + ".")
    _sweep_chart(table)
    shown = table.assign(**{"recompute (s)": table["recompute (s)"].map(lambda s: "not measured" if pd.isna(s) else s)})
    show_text_table(shown, ctx.clock)
    st.caption(SWEEP_LEGEND)


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
