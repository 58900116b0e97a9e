"""The kvobs dashboard (Streamlit). Started by `kvobs dashboard --store URL [--jaeger-url URL]`, or directly:

    KVOBS_STORE_URL=sqlite:///kvobs.db streamlit run dashboard/app.py

Pages are Streamlit pages (`st.navigation`) at their own paths (`/sessions`); a link of the form the dashboard used
before, `?page=sessions`, opens the same page, and `?session=ID&step=N` opens that step's story; the
time range is relative to the newest data in the store, so a recorded store reads the same as a live one; times
are shown in the browser's zone or UTC (`dashboard.clock`); a fleet's instances are chosen in the sidebar (or with
`?instance=NAME`, repeatable); when the range spans an engine restart, one run or all (`?run=ID`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import streamlit as st

if __package__ in (None, ""):  # `streamlit run dashboard/app.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboard.context import (  # noqa: E402
    Context,
    bucket_for,
    choose_clock,
    choose_instances,
    choose_range,
    choose_run,
)
from dashboard.views import PAGES, cache  # noqa: E402
from kvobs.analytics.runs import overlapping  # noqa: E402
from kvobs.store.db import redacted_url as _redact  # noqa: E402
from kvobs.store.db import store_url  # noqa: E402

JAEGER_URL_ENV = "KVOBS_JAEGER_URL"
DEFAULT_PAGE = "overview"  # the page at the dashboard's root URL
STORY_PARAMS = ("session", "step")  # `?session=...&step=...` opens one step's story (links from alerts, Jaeger)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store")
    parser.add_argument("--jaeger-url")
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args


def _requested_page(names: list[str]) -> str | None:
    """The page a `?page=` link names (or the story, for `?session=&step=`); None when the URL names none."""
    requested = st.query_params.get("page")
    if requested is None and all(p in st.query_params for p in STORY_PARAMS):
        requested = "step"
    return requested if requested in names else None


def main() -> None:
    st.set_page_config(page_title="kvobs", page_icon=":material/memory:", layout="wide")
    contexts: list[Context] = []  # the one this run makes, for the page to render
    pages = {
        key: st.Page(_page(key, contexts), title=view.TITLE, url_path=key, default=key == DEFAULT_PAGE)
        for key, view in PAGES.items()
    }
    current = st.navigation(list(pages.values()))
    requested = _requested_page(list(pages))
    if requested is not None and pages[requested] is not current:  # a `?page=` link: open its page, same filters
        kept = {key: st.query_params.get_all(key) for key in st.query_params if key != "page"}
        st.switch_page(pages[requested], query_params=kept)
    # The sidebar's choices live here, in the entrypoint, so they stay as they are when the page changes.
    context = _context(current.title)
    if context is not None:
        contexts.append(context)
        current.run()


def _page(key: str, contexts: list[Context]):
    def render() -> None:
        PAGES[key].render(contexts[-1])

    render.__name__ = key  # Streamlit names a page's script by its function
    return render


def _context(title: str) -> Context | None:
    """The store, the range, the instances and the run chosen in the sidebar; None (said on the page) when the store
    is empty."""
    args = _arguments()
    url = store_url(args.store)
    jaeger_url = args.jaeger_url or os.environ.get(JAEGER_URL_ENV)
    st.sidebar.title("kvobs")
    clock = choose_clock()
    try:
        cache.get_store(url)
        bounds = cache.time_range(url)
    except Exception as exc:  # a store that cannot be opened: say so, not a stack trace
        st.error(f"Cannot open the store `{_redact(url)}`: {exc}")
        st.stop()
    if bounds is None:
        _store_caption(url)
        st.header(title)
        st.info(
            "The store is empty. Fill it with `kvobs demo`, or run `kvobs serve --store URL` with "
            "`kvobs agents`, or `kvobs collect` next to a vLLM; this page updates as data arrives."
        )
        return None
    first, last = bounds
    since, until = choose_range(first, last, clock)
    fleet = tuple(cache.instances(url))
    instances = choose_instances(list(fleet))
    shown = list(fleet if instances is None else instances)
    runs = overlapping(cache.runs(url), since, until, shown or None)
    run = choose_run(runs, clock, single_instance=len(shown) <= 1)
    if run is not None:  # one run: its stretch of the range, on its instance
        since = max(since, run["started_at"])
        if run["ended_at"] == run["ended_at"]:  # ended (NaN: still running)
            until = min(until, run["ended_at"])
        instances = (run["instance"],) if len(fleet) > 1 else instances
        runs = overlapping(runs, since, until, [run["instance"]])
    st.sidebar.caption(f"{clock.iso(since)} to {clock.iso(until)}")
    _store_caption(url)
    interval = cache.sample_interval(url, since, until, instances)
    window_s = bucket_for(since, until, at_least=interval)
    return Context(url, since, until, window_s, jaeger_url, clock, interval, instances, fleet, runs, run is not None)


def _store_caption(url: str) -> None:
    """The store in one short line (a SQLite file by its name; the whole URL, password hidden, on hover)."""
    shown = _redact(url)
    if url.startswith("sqlite:///"):
        shown = "sqlite: " + Path(url.removeprefix("sqlite:///")).name
    st.sidebar.caption(f"Store: `{shown}`", help=_redact(url))


main()
