"""The kvobs dashboard (Streamlit). Started by `kvobs dashboard --store URL [--jaeger-url URL]`, or directly:

    KVOBS_STORE_URL=sqlite:///kvobs.db streamlit run dashboard/app.py

Pages are chosen in the sidebar (or with `?page=sessions`); the time range is relative to the newest data in the
store, so a recorded store reads the same as a live one.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

if __package__ in (None, ""):  # `streamlit run dashboard/app.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dashboard.data import bucket_for  # noqa: E402
from dashboard.views import PAGES, cache  # noqa: E402
from kvobs.store.db import store_url  # noqa: E402

JAEGER_URL_ENV = "KVOBS_JAEGER_URL"
RANGES = {"everything": None, "last 5 minutes": 300, "last 15 minutes": 900, "last hour": 3600,
          "last 6 hours": 21600, "last 24 hours": 86400}  # fmt: skip


@dataclass(frozen=True)
class Context:
    url: str
    since: float
    until: float
    window_s: float
    jaeger_url: str | None


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store")
    parser.add_argument("--jaeger-url")
    args, _ = parser.parse_known_args(sys.argv[1:])
    return args


def main() -> None:
    st.set_page_config(page_title="kvobs", page_icon=":material/memory:", layout="wide")
    args = _arguments()
    url = store_url(args.store)
    jaeger_url = args.jaeger_url or os.environ.get(JAEGER_URL_ENV)
    names = list(PAGES)
    requested = st.query_params.get("page", names[0])
    with st.sidebar:
        st.title("kvobs")
        page = st.radio("Page", names, index=names.index(requested) if requested in names else 0,
                        format_func=lambda key: PAGES[key].TITLE, key="page")  # fmt: skip
        range_name = st.selectbox("Time range", list(RANGES), key="range")
        st.caption(f"Store: `{_redact(url)}`")
    st.query_params["page"] = page
    try:
        cache.get_store(url)
        bounds = cache.time_range(url)
    except Exception as exc:  # a store that cannot be opened: say so, not a stack trace
        st.error(f"Cannot open the store `{_redact(url)}`: {exc}")
        st.stop()
    if bounds is None:
        st.header(PAGES[page].TITLE)
        st.info("The store is empty. Fill it with `kvobs demo`, or run `kvobs serve --store URL` with "
                "`kvobs agents`, or `kvobs collect` next to a vLLM; this page updates as data arrives.")  # fmt: skip
        return
    first, last = bounds
    span = RANGES[range_name]
    since = first if span is None else max(first, last - span)
    PAGES[page].render(Context(url, since, last, bucket_for(since, last), jaeger_url))


def _redact(url: str) -> str:
    from sqlalchemy import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


main()
