"""The pages' reads, cached: each as `cache.X(url, ...)`, the store opened once per URL, the answer kept 10 s.

    cache.overview(url, since, until, window_s, instances)    # dashboard.data.overview(store, ...), cached

Keyed by the store URL and the arguments; 10 s, so a page over a live store shows new data on its next rerun.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd
import streamlit as st

from dashboard import data, session_data, verdicts, whatif_data
from kvobs.analytics.cache import session_ties
from kvobs.analytics.cache import tier_hits as _tier_hits
from kvobs.analytics.cache import tier_lookups as _tier_lookups
from kvobs.analytics.runs import run_table
from kvobs.analytics.steps import SessionRead
from kvobs.analytics.steps import step_story as _step_story
from kvobs.store import Store, open_store

TTL_S = 10


@st.cache_resource(show_spinner=False)
def get_store(url: str) -> Store:
    return open_store(url)


@st.cache_resource(ttl=60, show_spinner=False)
def replay_plans(url: str, since, until, instances):
    """The range's what-if plans (`dashboard.whatif_data.replay_plans`), built once for every replay the What-if
    page makes of them (the replays only read them)."""
    return whatif_data.replay_plans(get_store(url), since, until, instances)


def cached(read: Callable) -> Callable:
    """`read(store, *args, **kwargs)` as a cached `f(url, *args, **kwargs)`."""

    def call(url: str, *args, **kwargs):
        return read(get_store(url), *args, **kwargs)

    # Streamlit keys a cache by the function's module, qualified name and source: one name per read, or the reads
    # made here would share one cache and answer each other's calls.
    call.__name__, call.__qualname__ = read.__name__, f"cached.{read.__module__}.{read.__qualname__}"
    return st.cache_data(ttl=TTL_S, show_spinner=False)(call)


def _instances(store: Store) -> list[str]:
    return store.reads.instances()


def _runs(store: Store) -> pd.DataFrame:
    return run_table(store.reads.runs())


time_range = cached(data.observed_range)
instances = cached(_instances)
runs = cached(_runs)
sample_interval = cached(data.sample_interval)
overview = cached(data.overview)
fleet_routing = cached(data.fleet_routing)
session_shortfall = cached(session_data.session_shortfall)
session_tax = cached(session_data.session_tax)
pressure = cached(data.pressure)
sessions = cached(session_data.sessions)
session_detail = cached(session_data.session_detail)
failures = cached(verdicts.failures)
slow_steps = cached(verdicts.slow)
kv_events = cached(data.kv_events_page)
alerts = cached(data.alerts_page)
sessions_with_steps = cached(session_data.sessions_with_steps)
session_ties = cached(session_ties)
tier_hits = cached(_tier_hits)
tier_lookups = cached(_tier_lookups)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _story(url: str, session_id: str, step_index: int, _read: SessionRead | None):
    """Keyed by the step alone (Streamlit leaves an argument named with a leading `_` out of the key)."""
    return _step_story(get_store(url), session_id, step_index, read=_read)


def step_story(url: str, session_id: str, step_index: int):
    """A step's story over its session's cached detail: the session's steps, requests and verdicts are read and
    worked out once for the Sessions page, its step choosers and the story (`step_story`'s `SessionRead`)."""
    return _story(url, session_id, step_index, session_detail(url, session_id).read)


def session_steps_by_cache_cost(url: str, session_id: str) -> list[int]:
    """The session's steps by what the cache cost them (from its cached detail: one attribution a session)."""
    return session_data.steps_by_cache_cost(session_detail(url, session_id).steps)
