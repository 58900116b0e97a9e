"""Cached calls into `dashboard.data` (keyed by store URL and arguments; 10 s so a live store refreshes)."""

from __future__ import annotations

import streamlit as st

from dashboard import data


@st.cache_resource(show_spinner=False)
def get_store(url: str):
    from kvobs.store import open_store

    return open_store(url)


_store = get_store


@st.cache_data(ttl=10, show_spinner=False)
def time_range(url: str):
    from kvobs.store import queries

    return queries.time_range(get_store(url))


@st.cache_data(ttl=10, show_spinner=False)
def overview(url, since, until, window_s):
    return data.overview(_store(url), since, until, window_s)


@st.cache_data(ttl=10, show_spinner=False)
def pressure(url, since, until, window_s, x, y):
    return data.pressure(_store(url), since, until, window_s, x, y)


@st.cache_data(ttl=10, show_spinner=False)
def sessions(url, since, until):
    return data.sessions(_store(url), since, until)


@st.cache_data(ttl=10, show_spinner=False)
def session_detail(url, session_id):
    return data.session_detail(_store(url), session_id)


@st.cache_data(ttl=10, show_spinner=False)
def failures(url, since, until):
    return data.failures(_store(url), since, until)


@st.cache_data(ttl=10, show_spinner=False)
def kv_events(url, since, until, window_s):
    return data.kv_events_page(_store(url), since, until, window_s)


@st.cache_data(ttl=10, show_spinner=False)
def alerts(url, since, until):
    return data.alerts_page(_store(url), since, until)
