"""Cached calls into `dashboard.data` (keyed by store URL and arguments; 10 s so a live store refreshes)."""

from __future__ import annotations

import streamlit as st

from dashboard import data
from kvobs.store import open_store


@st.cache_resource(show_spinner=False)
def get_store(url: str):
    return open_store(url)


@st.cache_data(ttl=10, show_spinner=False)
def time_range(url: str):
    return data.observed_range(get_store(url))


@st.cache_data(ttl=10, show_spinner=False)
def instances(url: str):

    return get_store(url).reads.instances()


@st.cache_data(ttl=10, show_spinner=False)
def runs(url: str):
    from kvobs.analytics.runs import run_table

    return run_table(get_store(url).reads.runs())


@st.cache_data(ttl=10, show_spinner=False)
def sample_interval(url: str, since: float, until: float, instances=None):
    return data.sample_interval(get_store(url), since, until, instances)


@st.cache_data(ttl=10, show_spinner=False)
def overview(url, since, until, window_s, instances=None, per_instance=False):
    return data.overview(get_store(url), since, until, window_s, instances, per_instance=per_instance)


@st.cache_data(ttl=10, show_spinner=False)
def pressure(url, since, until, window_s, x, y, instances=None):
    return data.pressure(get_store(url), since, until, window_s, x, y, instances=instances)


@st.cache_data(ttl=10, show_spinner=False)
def sessions(url, since, until, instances=None):
    return data.sessions(get_store(url), since, until, instances)


@st.cache_data(ttl=10, show_spinner=False)
def session_detail(url, session_id):
    return data.session_detail(get_store(url), session_id)


@st.cache_data(ttl=10, show_spinner=False)
def failures(url, since, until):
    return data.failures(get_store(url), since, until)


@st.cache_data(ttl=10, show_spinner=False)
def kv_events(url, since, until, window_s, instances=None):
    return data.kv_events_page(get_store(url), since, until, window_s, instances)


@st.cache_data(ttl=10, show_spinner=False)
def alerts(url, since, until, instances=None):
    return data.alerts_page(get_store(url), since, until, instances)


@st.cache_data(ttl=10, show_spinner=False)
def sessions_with_steps(url, since, until, instances=None):
    return data.sessions_with_steps(get_store(url), since, until, instances)


def session_steps_by_cache_cost(url, session_id):
    """The session's steps by what the cache cost them (from its cached detail: one attribution a session)."""
    return data.steps_by_cache_cost(session_detail(url, session_id)["steps"])


@st.cache_data(ttl=10, show_spinner=False)
def step_story(url, session_id, step_index):
    from kvobs.analytics.step_story import step_story

    return step_story(get_store(url), session_id, step_index)
