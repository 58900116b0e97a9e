"""No page raises on any store: one filled by a single source of the recorded vLLM run through a real collector
(its KV events alone, its /metrics alone, its request spans alone, the agent SDK's steps alone) and an empty one.
Each page renders, and where it lacks what it draws it says so and names the flag that would bring it."""

from __future__ import annotations

import pytest

from dashboard import glossary
from dashboard.views import PAGES
from kvobs.store import open_store
from tests.collectors.recorded_run import collect_recorded_source
from tests.dashboard.test_app import assert_clean, open_page

SOURCES = ("kv", "scrape", "spans", "steps")


@pytest.fixture(scope="module")
def partial_stores(tmp_path_factory) -> dict[str, str]:
    urls = {}
    for source in SOURCES:
        url = f"sqlite:///{tmp_path_factory.mktemp(f'only-{source}') / 'kvobs.db'}"
        store = open_store(url)
        with collect_recorded_source(store, source):
            pass
        store.close()
        urls[source] = url
    return urls


@pytest.mark.parametrize("page", list(PAGES))
@pytest.mark.parametrize("source", SOURCES)
def test_every_page_renders_on_a_store_of_one_source(monkeypatch, partial_stores, source, page):
    at = open_page(monkeypatch, partial_stores[source], page)
    assert_clean(at)
    shown = [e.value for e in (*at.markdown, *at.info, *at.caption, *at.warning)]
    assert shown, f"page {page} on a store of {source} alone shows nothing at all"
    said = " ".join(e.value for e in (*at.info, *at.warning))
    for missing in LACKS[source].get(page, ()):  # what it lacks, with the flag that would bring it
        assert glossary.MISSING[missing] in said, (page, missing, said)


# page -> the sources it says it lacks, for a store of each source alone
LACKS = {
    "kv": {"overview": ["snapshots", "requests", "steps"], "step": ["steps"], "whatif": ["requests"]},
    "scrape": {"overview": ["kv_events", "requests", "steps"], "kv_events": ["kv_events"], "sessions": ["sessions"]},
    "spans": {"overview": ["snapshots", "kv_events", "steps"], "kv_events": ["kv_events"], "sessions": ["sessions"]},
    "steps": {"overview": ["snapshots", "kv_events", "requests"], "kv_events": ["kv_events"]},
}
