"""`kvobs dashboard` started for real (streamlit run on loopback) and every page opened in headless Chromium, on the
engine run and on the recorded vLLM run: the page's header renders with no Streamlit exception box, times read in
the browser's zone (Chromium runs in America/St_Johns, UTC-03:30, so a time in UTC or the server's zone shows),
and a step's timeline opens from its URL. Screenshots go to $KVOBS_SCREENSHOTS when set (docs/screenshots is made
so), else to the test's temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dashboard.views import PAGES
from tests.dashboard.browser import chromium, chromium_binary
from tests.runs import Run, measured_copy
from tests.server.conftest import free_port
from tests.waiting import wait_for

READY = (
    "[...document.querySelectorAll('h2')].some(h => h.innerText.trim() === {title!r}) && "
    "!document.querySelector('[data-testid=\"stStatusWidgetRunningIcon\"]')"
)
EXCEPTION = "stException"
STORY = "What happened, in order"  # the step story's heading
# what every selectbox shows chosen (its text and its input's value)
SELECTED = (
    "[...document.querySelectorAll('[data-testid=\"stSelectbox\"]')].map(e => e.textContent + ' ' + "
    "[...e.querySelectorAll('input')].map(i => i.value).join(' ')).join(' ')"
)
BROWSER_ZONE, OFFSET = "America/St_Johns", "-03:30"  # an offset no CI machine has by accident

pytestmark = pytest.mark.skipif(
    chromium_binary() is None and not os.environ.get("CI"),
    reason="needs Debian's chromium (.ci/run installs it; in CI its absence fails)",
)


def dashboard(run) -> str:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kvobs.cli",
            "dashboard",
            "--store",
            run.url,
            "--port",
            str(port),
            "--jaeger-url",
            "http://127.0.0.1:16686",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/_stcore/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    wait_for(healthy, timeout_s=60)
    assert proc.poll() is None, proc.stderr.read()
    return url, proc


@pytest.fixture(params=["agent_run", "vllm_run", "fleet_run"])
def served(request):
    run = request.getfixturevalue(request.param)
    url, proc = dashboard(run)
    try:
        yield request.param, run, url
    finally:
        proc.terminate()
        proc.wait(20)


def test_every_page_renders_in_chromium(served, tmp_path, monkeypatch):
    name, run, url = served
    shots = Path(os.environ.get("KVOBS_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TZ", BROWSER_ZONE)  # Chromium's zone: what "local" means in the page
    steps = run.store.reads.steps()
    worst = steps.sort_values(["status", "e2e_s"], ascending=[True, False]).iloc[0]  # "error" sorts first
    visits = {key: f"?page={key}" for key in PAGES}
    visits["step_url"] = f"?session={worst['session_id']}&step={worst['step_index']}"
    with chromium() as page:
        for key, query in visits.items():
            title = PAGES["step" if key == "step_url" else key].TITLE
            ready = READY.format(title=title)
            if key == "step_url":  # the story draws after the page's header: wait for it too (a loaded machine)
                ready += f" && document.body.innerText.includes({STORY!r})"
            text, png = page.visit(f"{url}/{query}", ready)
            (shots / f"{name.split('_')[0]}-{key}.png").write_bytes(png)
            assert png.startswith(b"\x89PNG") and len(png) > 20_000, key  # a drawn page, not a blank one
            assert title in text and "Traceback" not in text and "Error" not in text.split("\n")[0]
            assert not page.evaluate(f"Boolean(document.querySelector('[data-testid=\"{EXCEPTION}\"]'))"), key
            assert OFFSET in text, key  # the range in the sidebar, and every table's times, in the browser's zone
            if key == "step_url":
                chosen = page.evaluate(SELECTED)
                assert STORY in text and worst["session_id"] in chosen, chosen


def test_a_fleet_overview_in_chromium(fleet_run, tmp_path, monkeypatch):
    """Two replicas: the sidebar offers both, the Overview draws one row and one small chart per instance, and the
    routing loss with the hit-rate shortfall split, as the collector measured them."""
    shots = Path(os.environ.get("KVOBS_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TZ", BROWSER_ZONE)
    measured = measured_copy(fleet_run, tmp_path)
    url, proc = dashboard(Run(measured.url, measured))
    per_instance = (
        "[...document.querySelectorAll('h3')].find(h => h.innerText.trim() === 'Per instance')?.scrollIntoView()"
    )
    routing = per_instance.replace("'Per instance'", "'Routing loss'")
    try:
        with chromium() as page:
            ready = READY.format(title="Overview") + " && " + per_instance.replace("?.scrollIntoView()", "")
            text, png = page.visit(f"{url}/?page=overview", ready, scroll_js=per_instance, settle_s=3.0)
            assert not page.evaluate(f"Boolean(document.querySelector('[data-testid=\"{EXCEPTION}\"]'))")
            ready = READY.format(title="Overview") + " && " + routing.replace("?.scrollIntoView()", "")
            routed_text, routed_png = page.visit(f"{url}/?page=overview", ready, scroll_js=routing, settle_s=3.0)
    finally:
        proc.terminate()
        proc.wait(20)
    (shots / "fleet-per_instance.png").write_bytes(png)
    (shots / "fleet-routing_loss.png").write_bytes(routed_png)
    assert png.startswith(b"\x89PNG") and len(png) > 20_000 and len(routed_png) > 20_000
    assert "Per instance" in text and "all 2 instances" in text
    assert "vllm-a" in text and "vllm-b" in text and OFFSET in text
    assert "Routing loss" in routed_text and "Hit-rate shortfall, split" in routed_text
    assert "Measured by the collector" in routed_text
    measured.close()


def test_a_timed_out_steps_story_in_chromium(overload, tmp_path, monkeypatch):
    """A step that timed out in the queue, never scheduled (the scripted overload run: its truth is exact): its story
    in the browser says why it failed, with its seconds, and that its lost prefix cost it nothing."""
    _, store = overload
    text = _step_story(store, "q1", 1, "timeout-step_url.png", tmp_path, monkeypatch)
    assert "why it failed: waiting in the queue" in text and "the whole step" in text
    assert "timed out after 1.00 s: waiting in the queue" in text and "was never scheduled" in text
    assert "Where its latency went" in text and "Traceback" not in text


def test_a_step_whose_request_never_reached_the_server_in_chromium(unreached, tmp_path, monkeypatch):
    """A timed-out step whose request never reached the server (the scripted `unreached` run: its truth is exact):
    its story in the browser names it, with the evidence that the server would have recorded it."""
    _, store = unreached
    text = _step_story(store, "b", 1, "unreached-step_url.png", tmp_path, monkeypatch)
    assert "why it failed: its request never reached the server" in text
    assert "abandoned requests recorded" in text and "Where its latency went" in text and "Traceback" not in text
    assert "it never reached the server, as the evidence above shows" in text and "split are unknown" not in text


def test_a_named_miss_in_chromium(changing_start_run, tmp_path, monkeypatch):
    """A step of a session whose prompt changes near its start (the real-server `changing_start_run`): its story in
    the browser names the miss no cache size would change, with its fix."""
    from kvobs.analytics.cache.prompt_starts import FIX

    text = _step_story(changing_start_run.store, "stamped", 2, "changing-start-step_url.png", tmp_path, monkeypatch)
    assert "A miss that is not the cache's: session stamped:" in text and FIX in text and "Traceback" not in text


def _step_story(store, session: str, step: int, shot: str, tmp_path, monkeypatch) -> str:
    """A step's story opened from its URL in Chromium over a real dashboard on `store`: its text; its screenshot
    saved as `shot`."""
    ready = READY.format(title=PAGES["step"].TITLE) + f" && document.body.innerText.includes({STORY!r})"
    return _page_text(store, f"?session={session}&step={step}", ready, shot, tmp_path, monkeypatch)


def _page_text(store, query: str, ready: str, shot: str, tmp_path, monkeypatch) -> str:
    """The page at `query`, once `ready` holds, in Chromium over a real dashboard on `store`: its text; its
    screenshot saved as `shot`."""
    shots = Path(os.environ.get("KVOBS_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TZ", BROWSER_ZONE)
    url, proc = dashboard(Run(store.url, store))
    try:
        with chromium() as page:
            text, png = page.visit(f"{url}/{query}", ready)
    finally:
        proc.terminate()
        proc.wait(20)
    (shots / shot).write_bytes(png)
    return text


def test_a_dynamo_imported_session_in_chromium(tmp_path, monkeypatch):
    """A Dynamo request trace imported (`kvobs import dynamo-trace`, recorded with Dynamo's own frontend): the
    Sessions page draws (its table says who started whom), and a subagent's step story shows the tool call in the
    pause before it."""
    from collectors.dynamo_trace import import_dynamo_trace
    from kvobs.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'dynamo.db'}")
    import_dynamo_trace(store, [Path(__file__).parents[1] / "fixtures" / "dynamo-trace" / "request_trace.jsonl"])
    sessions = READY.format(title=PAGES["sessions"].TITLE)
    text = _page_text(store, "?page=sessions", sessions, "dynamo-sessions.png", tmp_path, monkeypatch)
    # (the table is drawn where innerText does not reach: its started by / subagents columns are in the screenshot)
    assert "Steps and what explains them" in text and "worker-" in text and "Traceback" not in text
    story = _step_story(store, "researcher", 1, "dynamo-step_url.png", tmp_path, monkeypatch)
    assert "web_search" in story and "Traceback" not in story
    store.close()
