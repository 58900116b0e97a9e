"""The README's reference parts stay true: its schema table names every column of every table, and every flag of
`kvobs demo` and `kvobs serve` it lists is a real flag (and every real one is listed)."""

from __future__ import annotations

import re
from pathlib import Path

from kvobs.cli import build_parser
from kvobs.store.schema import Base

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + len(title))
    return README[start:end]


def test_the_schema_table_lists_every_column_of_every_table():
    schema = _section("### Schema (a public interface)")
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
    quick_start = _section("## Quick start (no Docker): two commands")
    assert set(re.findall(r"`(--[a-z-]+)", quick_start)) == _flags("demo")
    serve_row = next(line for line in _section("## Configuration").splitlines() if line.startswith("| `kvobs serve`"))
    assert set(re.findall(r"`(--[a-z-]+)", serve_row)) == _flags("serve")
