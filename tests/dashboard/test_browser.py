"""`kvobs dashboard` started for real (streamlit run on loopback) and every page opened in headless Chromium:
the page's header must render, with no Streamlit exception box, and a screenshot is taken."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from dashboard.views import PAGES
from tests.dashboard.browser import chromium, chromium_binary
from tests.server.conftest import free_port
from tests.waiting import wait_for

READY = ("[...document.querySelectorAll('h2')].some(h => h.innerText.trim() === {title!r}) && "
         "!document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')")  # fmt: skip
EXCEPTION = "stException"


@pytest.fixture
def dashboard_url(agent_run):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvobs.cli", "dashboard", "--store", agent_run.url, "--port",
                             str(port), "--jaeger-url", "http://127.0.0.1:16686"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/_stcore/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    try:
        wait_for(healthy, timeout_s=60)
        assert proc.poll() is None, proc.stderr.read()
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.skipif(
    chromium_binary() is None and not os.environ.get("CI"),
    reason="needs Debian's chromium (.ci/run installs it; in CI its absence fails)",
)
def test_every_page_renders_in_chromium(dashboard_url, tmp_path):
    with chromium() as page:
        for key, view in PAGES.items():
            text, png = page.visit(f"{dashboard_url}/?page={key}", READY.format(title=view.TITLE))
            (tmp_path / f"{key}.png").write_bytes(png)
            assert png.startswith(b"\x89PNG") and len(png) > 20_000, key  # a drawn page, not a blank one
            assert view.TITLE in text and "Traceback" not in text and "Error" not in text.split("\n")[0]
            assert not page.evaluate(f"Boolean(document.querySelector('[data-testid=\"{EXCEPTION}\"]'))"), key
