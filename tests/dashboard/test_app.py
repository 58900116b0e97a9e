"""Every dashboard page through Streamlit's AppTest, on stores from real runs, an empty store and a bad URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.views import PAGES

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")


def open_page(monkeypatch, url: str, page: str, jaeger: str | None = None) -> AppTest:
    monkeypatch.setenv("KVOBS_STORE_URL", url)
    if jaeger:
        monkeypatch.setenv("KVOBS_JAEGER_URL", jaeger)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = page
    return at.run()


def assert_clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_renders_on_the_engine_run(monkeypatch, agent_run, page):
    at = open_page(monkeypatch, agent_run.url, page, jaeger="http://jaeger.example:16686")
    assert_clean(at)
    assert at.header[0].value == PAGES[page].TITLE
    if page == "overview":
        metrics = {m.label: m.value for m in at.metric}
        assert metrics["agent steps"] == "18" and metrics["requests"] == "18"
        assert metrics["failed steps"] == str(agent_run.result.num_failed)
    if page == "sessions":
        assert len(at.selectbox(key="session").options) == 6
        steps = at.dataframe[1].value
        assert len(steps) == 3 and set(steps["slow_cause"]) <= {"invalidated", "prefix_evicted_in_pause", "preempted",
                                                                "queue_wait", "cold_prefix", "none"}  # fmt: skip
        failed, ok = steps[steps["status"] == "error"], steps[steps["status"] == "ok"]
        assert failed["failure_cause"].notna().all() and ok["failure_cause"].isna().all()
        assert steps["trace"].str.startswith("http://jaeger.example:16686/trace/").all()
    if page == "pressure":
        at.selectbox(key="pressure_y").set_value("ttft_p50").run()
        assert_clean(at)
        assert len(at.dataframe[0].value) == 13  # lags -6..6
    if page == "whatif":
        at.text_input(key="whatif_sizes").set_value("30,60")
        at.button[0].click().run()
        assert_clean(at)
        table = at.dataframe[0].value
        assert list(table["configuration"]) == ["observed", "lru", "lru"] and list(table["blocks"][1:]) == [30, 60]


@pytest.mark.parametrize("page", ["overview", "sessions", "kv_events", "whatif"])
def test_pages_on_the_vllm_run(monkeypatch, vllm_run, page):
    at = open_page(monkeypatch, vllm_run.url, page)
    assert_clean(at)
    if page == "sessions":
        assert "sess-00" in at.selectbox(key="session").options


@pytest.mark.parametrize("page", list(PAGES))
def test_empty_store_shows_an_empty_state(monkeypatch, tmp_path, page):
    at = open_page(monkeypatch, f"sqlite:///{tmp_path / 'empty.db'}", page)
    assert_clean(at)
    assert "The store is empty" in at.info[0].value


def test_a_store_that_cannot_be_opened_says_so(monkeypatch):
    at = open_page(monkeypatch, "postgresql://nobody@127.0.0.1:1/none", "overview")
    assert not at.exception
    assert "Cannot open the store" in at.error[0].value


def test_bad_whatif_sizes_get_a_message(monkeypatch, agent_run):
    at = open_page(monkeypatch, agent_run.url, "whatif")
    at.text_input(key="whatif_sizes").set_value("30,big")
    at.button[0].click().run()
    assert not at.exception and "whole numbers" in at.error[0].value
