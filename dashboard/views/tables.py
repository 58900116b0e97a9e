"""Tables as people read them: headers from the glossary (with what each column counts on hover), times as ISO
strings in the page's clock, durations in seconds, rates as percentages, counts as whole numbers, causes in words,
and a blank where a value is unknown (never `None`).

    show_table(frame, clock)          # a sortable, scrollable grid: long tables
    show_text_table(frame, clock)     # wrapped text and links (markdown): evidence, a step's story, few rows
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import glossary
from dashboard.clock import Clock

PERCENT_COLUMNS = (
    "hit_rate",
    "hit rate",
    "join_rate",
    "kv_usage",
    "kv_usage_max",
    "churn",
    "share",
    "dominant_share",
    "routed_share",
    "achieved_rate",
    "available_rate",
    "loaded_share",
    "found_share",
    "recompute_tax",
)
CAUSE_COLUMNS = ("failure_cause", "slow_cause", "cause")
WIDE_COLUMNS = ("evidence", "error_type", "summary", "what", "detail")


def _integral(column: pd.Series) -> bool:
    values = pd.to_numeric(column, errors="coerce").dropna()
    return pd.api.types.is_numeric_dtype(column) and not values.empty and bool((values == values.round()).all())


def _prepared(frame: pd.DataFrame, clock: Clock, ms: bool) -> pd.DataFrame:
    shown = clock.table(frame, ms=ms)
    for column in shown.columns:
        if column in CAUSE_COLUMNS:
            shown[column] = [glossary.cause(v) for v in shown[column]]
        elif shown[column].dtype == bool:
            shown[column] = np.where(shown[column], "yes", "")
    return shown


def show_table(
    frame: pd.DataFrame, clock: Clock, *, ms: bool = False, column_config: dict | None = None, **kwargs
) -> None:
    """`st.dataframe` of `frame`: glossary headers, times in `clock`, `*_s` columns in seconds, counts whole."""
    shown = _prepared(frame, clock, ms)
    config: dict = {}
    for column in shown.columns:
        name, help_text = glossary.label(str(column)), glossary.describe(str(column))
        numeric = pd.api.types.is_numeric_dtype(shown[column])
        number = partial(st.column_config.NumberColumn, name, help=help_text, width="small")  # the grid fits the page
        if numeric and column in PERCENT_COLUMNS:
            config[column] = number(format="percent")
        elif numeric and str(column).endswith("_s") and not _integral(shown[column]):
            config[column] = number(format="%.3f")
        elif numeric and _integral(shown[column]):
            config[column] = number(format="localized")
        elif numeric:
            config[column] = number(format="%.3g")
        else:
            config[column] = st.column_config.TextColumn(
                name, help=help_text, width="large" if column in WIDE_COLUMNS else None
            )
    config.update(column_config or {})
    st.dataframe(shown, hide_index=kwargs.pop("hide_index", True), column_config=config, placeholder="", **kwargs)


def show_text_table(frame: pd.DataFrame, clock: Clock, *, ms: bool = False) -> None:
    """`st.table` of `frame` as text that wraps (markdown links work): for evidence and stories, a few dozen rows."""
    shown = _prepared(frame, clock, ms)
    out = pd.DataFrame(index=shown.index)
    for column in shown.columns:
        out[glossary.label(str(column))] = [_cell(v, str(column)) for v in shown[column]]
    st.table(out, hide_index=True)


def _cell(value, column: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (int, np.integer)):
        return f"{value:,}"
    if isinstance(value, (float, np.floating)):
        if column in PERCENT_COLUMNS:
            return f"{value:.1%}"
        if column.endswith("_s"):
            return f"{value:.3f}"
        return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.3g}"
    return str(value)
