"""Time-series charts over frames indexed by epoch seconds, with an empty state instead of an empty chart."""

from __future__ import annotations

import pandas as pd
import streamlit as st


def by_time(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its epoch-seconds index as datetimes (what Streamlit's charts put on a time axis)."""
    out = frame.copy()
    out.index = pd.to_datetime(out.index, unit="s")
    return out


def time_chart(chart, frame: pd.DataFrame, empty: str, **kwargs) -> None:
    """Draw `chart` (st.line_chart, st.area_chart, ...) over `frame` by time, or say `empty` when there is nothing."""
    if frame.empty:
        st.info(empty)
    else:
        chart(by_time(frame), **kwargs)
