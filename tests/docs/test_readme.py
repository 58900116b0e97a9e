"""The docs' reference parts stay true: the store page's schema table names every column of every table, and every
flag of `kvobs demo` and `kvobs serve` the quick start and configuration pages list is a real flag (and every real
one is listed); every `kvobs` command in the README and the docs pages parses."""

from __future__ import annotations

import re
from pathlib import Path

from kvobs.cli import build_parser
from kvobs.store.schema import Base

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(page: str, title: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def test_the_schema_table_lists_every_column_of_every_table():
    schema = _section("store.md", "### Schema (a public interface)")
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \|[^|]*\| (.*) \|$", schema, re.MULTILINE)}
    tables = Base.metadata.tables  # the tables written as records and the rollups
    assert set(rows) == set(tables)
    for name, table in tables.items():
        listed = set(re.findall(r"`(\w+)`", rows[name]))
        assert {c.name for c in table.columns} <= listed, name


def _flags(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {opt for action in sub._actions for opt in action.option_strings if opt.startswith("--")} - {"--help"}


def test_the_quick_start_lists_the_demo_flags_and_configuration_the_serve_flags():
    quick_start = _section("quickstart.md", "## Quick start (no Docker): two commands")
    assert set(re.findall(r"`(--[a-z-]+)", quick_start)) == _flags("demo")
    serve_row = next(
        line
        for line in _section("configuration.md", "# Configuration").splitlines()
        if line.startswith("| `kvobs serve`")
    )
    assert set(re.findall(r"`(--[a-z-]+)", serve_row)) == _flags("serve")


def commands(text: str) -> list[list[str]]:
    """Every `kvobs` command in the text's shell blocks, as argv (continuations joined; comments and a trailing `&`
    dropped)."""
    import shlex

    found = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.split() or not line.split()[0].endswith("kvobs"):
                continue
            words = shlex.split(line, comments=True)
            if words and words[-1] == "&":
                words = words[:-1]
            if words and words[0].endswith("kvobs") and len(words) > 1:
                found.append(words[1:])
    return found


DOCS = [README, *(page.read_text() for page in sorted((ROOT / "docs").glob("**/*.md")))]


def test_every_command_in_the_docs_parses_and_a_serve_fits_its_cache():
    """Each `kvobs ...` line in the README and the docs pages, as written: its flags are real and their values
    valid (the command's own parser), and a `kvobs serve` line's cache holds one sequence of its length (the check
    it makes before it loads anything: the README once showed `--num-blocks 512` with the model's 8,192 context)."""
    from instrumented_engine.commands.engine_flags import check_cache_fits

    parser = build_parser()
    found = [argv for text in DOCS for argv in commands(text)]
    assert len(found) >= 10 and {argv[0] for argv in found} >= {"demo", "serve", "collect", "whatif", "alerts"}
    for argv in found:
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            raise AssertionError(f"does not parse: kvobs {' '.join(argv)}") from None
        if argv[0] in ("serve", "generate"):
            check_cache_fits(args)


def test_the_agents_page_shows_the_server_and_collector_its_recipes_talk_to():
    """The recipes run against `kvobs serve` on :8000 and `kvobs collect` on :4318: the page shows both commands, and
    they meet (the engine's spans and KV events go where the collector listens)."""
    from urllib.parse import urlsplit

    parser = build_parser()
    found = [parser.parse_args(argv) for argv in commands((ROOT / "docs" / "agents.md").read_text())]
    serve = next(a for a in found if a.command == "serve")
    collect = next(a for a in found if a.command == "collect")
    assert serve.port == 8000 and collect.otlp_http.endswith(":4318")
    assert urlsplit(serve.otlp_endpoint).port == int(collect.otlp_grpc.rsplit(":", 1)[1])
    assert serve.kv_events_endpoint.rsplit(":", 1)[1] == collect.kv_events[0].rsplit(":", 1)[1]
    assert any(url.endswith("127.0.0.1:8000") for url in collect.vllm_url)


def _measured(case: str, busy: int) -> str:
    """A figure of `bench/results/install.md` as its table writes it ("151 s"): the case of the run with `busy` busy
    loops."""
    text = (ROOT / "bench" / "results" / "install.md").read_text()
    row = re.search(rf"^\| install \| {re.escape(case)} \(extras all, {busy} busy loops[^|]*\| ([^|]+) \|", text, re.M)
    assert row, (case, busy)
    return row.group(1).strip()


def test_the_readmes_install_and_demo_figures_are_the_measured_ones():
    """The README quotes the install and the demo from the results file of a measured install in a fresh clone
    (`bench/install.py`), quiet and with a busy loop on each core, never a figure of its own."""
    quick_start = README[README.index("## Quick start") : README.index("## With Docker")]
    assert "bench/results/install.md" in quick_start
    for busy in (0, 2):
        for case in ("whole install", "demo: start to its dashboard", "demo: its first round"):
            assert _measured(case, busy) in quick_start, (case, busy)
    assert _measured("5/5 C++ CPU operations", 0) in quick_start


def test_the_install_says_its_c_stage_as_measured():
    """`scripts/install.sh` says the C++ stage's time from the results file, not a guess ("a minute or two")."""
    import subprocess

    script = (ROOT / "scripts" / "install.sh").read_text()
    measured = re.search(r"^measured\(\) \{.*?^\}", script, re.M | re.S).group(0)
    said = subprocess.run(
        ["bash", "-c", f'{measured}\nmeasured "5/5 C++ CPU operations"'], cwd=ROOT, capture_output=True, text=True
    ).stdout
    assert said.startswith(f"; measured: {_measured('5/5 C++ CPU operations', 0)} on ") and "install.md" in said
    assert "a minute or two" not in script
