"""Cached calls into `dashboard.data` (keyed by store URL and arguments; 10 s so a live store refreshes)."""

from __future__ import annotations

import streamlit as st

from dashboard import data
from kvobs.store import open_store, queries


@st.cache_resource(show_spinner=False)
def get_store(url: str):
    return open_store(url)


@st.cache_data(ttl=10, show_spinner=False)
def time_range(url: str):
    return queries.time_range(get_store(url))


@st.cache_data(ttl=10, show_spinner=False)
def overview(url, since, until, window_s):
    return data.overview(get_store(url), since, until, window_s)


@st.cache_data(ttl=10, show_spinner=False)
def pressure(url, since, until, window_s, x, y):
    return data.pressure(get_store(url), since, until, window_s, x, y)


@st.cache_data(ttl=10, show_spinner=False)
def sessions(url, since, until):
    return data.sessions(get_store(url), since, until)


@st.cache_data(ttl=10, show_spinner=False)
def session_detail(url, session_id):
    return data.session_detail(get_store(url), session_id)


@st.cache_data(ttl=10, show_spinner=False)
def failures(url, since, until):
    return data.failures(get_store(url), since, until)


@st.cache_data(ttl=10, show_spinner=False)
def kv_events(url, since, until, window_s):
    return data.kv_events_page(get_store(url), since, until, window_s)


@st.cache_data(ttl=10, show_spinner=False)
def alerts(url, since, until):
    return data.alerts_page(get_store(url), since, until)
