"""Tables as people read them: times as ISO strings in the page's clock, durations with their unit, rates as
percentages, long text wrapped in wide columns."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.clock import Clock

PERCENT_COLUMNS = ("hit_rate", "hit rate", "kv_usage", "kv_usage_max", "churn")
WIDE_COLUMNS = ("evidence", "error_type", "summary", "what", "detail")


def show_table(frame: pd.DataFrame, clock: Clock, *, ms: bool = False, column_config: dict | None = None,
               **kwargs) -> None:  # fmt: skip
    """`st.dataframe` of `frame` with its epoch-seconds columns in `clock`, `*_s` columns as seconds."""
    shown = clock.table(frame, ms=ms)
    config: dict = {}
    for column in shown.columns:
        numeric = pd.api.types.is_numeric_dtype(shown[column])
        if numeric and str(column).endswith("_s"):
            config[column] = st.column_config.NumberColumn(f"{str(column)[:-2]} (s)", format="%.3f s")
        elif numeric and column in PERCENT_COLUMNS:
            config[column] = st.column_config.NumberColumn(str(column), format="percent")
        elif column in WIDE_COLUMNS:
            config[column] = st.column_config.TextColumn(str(column), width="large")
    config.update(column_config or {})
    st.dataframe(shown, hide_index=kwargs.pop("hide_index", True), column_config=config, **kwargs)
