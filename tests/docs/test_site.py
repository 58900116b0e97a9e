"""The docs site builds with every link and anchor resolved (`mkdocs build --strict`: mkdocs.yml makes a broken
link, a missing anchor, a page left out of the nav or a results file that is not there an error), and the README
stays one page whose links land on files and headings that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
MAX_README_LINES = 200


def test_the_docs_site_builds_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()
    home = (tmp_path / "site" / "index.html").read_text()  # the README itself, its links made the site's
    assert "Observability and tracing for KV-cache behaviour in LLM agents." in home
    assert 'href="quickstart/"' in home and 'src="screenshots/agent-overview.png"' in home


def _anchors(page: Path) -> set[str]:
    return {slugify(title, "-") for title in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}


def test_the_readme_is_one_page_and_its_links_resolve():
    assert len(README.splitlines()) <= MAX_README_LINES
    links = re.findall(r"\]\(((?!https?:)[^)\s]+)\)", README)
    assert len(links) >= 10
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in _anchors(target), link


def test_a_plain_mkdocs_build_leaves_nothing_for_git_to_show():
    """`mkdocs build` (as a user runs it, into `site/`) writes only what .gitignore ignores."""
    named = re.search(r"^site_dir:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    site_dir = (named.group(1) if named else "site").strip("/")  # mkdocs' default
    ignored = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()}
    assert site_dir in ignored, f"{site_dir}/ is not in .gitignore"


MAX_MAP_WORDS = 3000
MAX_MAP_LINE = 120


def test_the_architecture_page_is_a_map():
    """docs/architecture.md holds the layers, the wings and their doors, one event's path and the rules the tests
    hold, in few words and lines a reader takes in at once; the details are on their subjects' pages."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert len(page.split()) <= MAX_MAP_WORDS
    assert [line for line in page.splitlines() if len(line) > MAX_MAP_LINE] == []
    headings = re.findall(r"^## (.+)$", page, re.MULTILINE)
    assert {"The layers", "Wings and their doors", "The rules the tests hold"} <= set(headings)
    for door in ("kvobs.analytics.cache", "kvobs.analytics.steps"):
        assert door in page
