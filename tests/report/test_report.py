"""`kvobs report` on our engine's run: one HTML page and its Markdown twin, each figure the analyses' own, drawn in
headless Chromium (its screenshot goes to $KVOBS_SCREENSHOTS when set)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from instrumented_engine.whatif.replay import ReplayPlan, simulate
from kvobs.analytics.cache import FLEET, range_tax, tax_words
from tests.dashboard.browser import chromium
from tests.runs import NUM_BLOCKS


def _report(url: str, out: Path, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "report", "--store", url, "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_report_says_what_the_analyses_say_and_draws_in_chromium(agent_run, tmp_path):
    out = tmp_path / "report"
    said = _report(agent_run.url, out, "--gpu-hour-cost", "2")
    assert said.startswith(f"wrote {out / 'report.html'} and {out / 'report.md'} (3 charts)")
    markdown = (out / "report.md").read_text()
    titles = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    assert titles == [
        "Hit rate and its shortfall",
        "Recompute tax",
        "Sessions that cost the most",
        "What-if: other cache sizes",
        f"TTL curve at the observed size ({NUM_BLOCKS} blocks)",
    ]
    tax = range_tax(agent_run.store, None, None).set_index("instance")
    assert f"{FLEET}: {tax_words(tax.loc[FLEET])}." in markdown  # the tax as the analysis says it
    plan = ReplayPlan.from_store(agent_run.store)
    doubled = simulate(plan, num_blocks=2 * NUM_BLOCKS)
    assert f"| lru | {2 * NUM_BLOCKS} | {doubled.hit_rate:.1%} |" in markdown  # the what-if's row for that size
    ttl = simulate(plan, num_blocks=NUM_BLOCKS, policy="session_ttl", ttl_s=3600)
    assert f"| 3,600 | {ttl.hit_rate:.1%} |" in markdown  # the TTL curve's last point
    assert "Sample: " in markdown and "Hit rate against the TTL" not in markdown  # (each section says its sample)
    page = (out / "report.html").read_text()
    assert "<script" not in page and "http" not in page.split("<body>")[1].split("<svg")[0]  # nothing fetched
    shots = Path(os.environ.get("KVOBS_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        ready = "document.querySelectorAll('svg').length === 3"
        text, png = browser.visit((out / "report.html").as_uri(), ready, settle_s=0.5)
        drawn = browser.evaluate(
            "Array.from(document.querySelectorAll('figure svg')).map(s => s.getBoundingClientRect().height)"
        )
    (shots / "report.png").write_bytes(png)
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert len(drawn) == 3 and min(drawn) > 100  # each chart drawn, not an empty box
    assert "Recompute tax" in text and "What-if: other cache sizes" in text


def test_a_store_with_nothing_gets_a_clear_refusal(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "report", "--store", f"sqlite:///{tmp_path / 'none.db'}", "--out", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.startswith("kvobs report: ")
