"""A clone is all a user has: no test, benchmark or script reads a path outside the repository (a directory beside
the checkout once held the recordings the tests read, and a fresh clone's test run stopped at collection).
`.ci/run` proves it by running in a clone in an empty directory; this finds the cause before CI does, by reading the
code: every path built from `__file__` (`Path(__file__).parents[N]`, `.parent` chains, `os.path.dirname` and "..")
must land inside the repository, and no code names a directory beside it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("tests", "bench", "scripts", ".ci", "kvobs", "collectors", "instrumented_engine", "dashboard", "deploy")
BESIDE = re.compile(r"\.\./shared\b|\"shared\"\s*/|/\s*\"shared\"")  # the sibling directory that is not ours


def _code_files() -> list[Path]:
    found = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*") if p.is_file()]
    return sorted(p for p in found if p.suffix in (".py", ".sh", ".yml", ".yaml", ".toml") or p.name == "run")


def _above_file(node: ast.AST) -> int | None:
    """How many directories up from its file's directory an expression built on `__file__` climbs, else None:
    `Path(__file__).resolve().parents[2]` -> 2, `Path(__file__).parent.parent` -> 1,
    `os.path.join(os.path.dirname(__file__), "..", "..")` -> 2."""
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "parents"
        and _on_file(node.value.value)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, int)
    ):
        return node.slice.value
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _above_file(node.value)
        if inner is not None:
            return inner + 1
        if _on_file(node.value):
            return 0
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join" and node.args:
        start = node.args[0]
        if isinstance(start, ast.Call) and getattr(start.func, "attr", None) == "dirname" and _on_file(start.args[0]):
            ups = [a for a in node.args[1:] if isinstance(a, ast.Constant) and a.value == ".."]
            return len(ups)
    return None


def _on_file(node: ast.AST) -> bool:
    """`__file__`, `Path(__file__)` or either `.resolve()`d or `.absolute()`d."""
    if isinstance(node, ast.Name):
        return node.id == "__file__"
    if isinstance(node, ast.Call):
        if getattr(node.func, "id", None) == "Path" and node.args:
            return _on_file(node.args[0])
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute"):
            return _on_file(node.func.value)
    return False


def climbs_out(path: Path, source: str) -> list[str]:
    """Each place in `source` (the text of `path`) whose path built on `__file__` leaves the repository."""
    depth = len(path.resolve().parent.relative_to(ROOT).parts)  # directories between the file and the root
    out = []
    for node in ast.walk(ast.parse(source)):
        up = _above_file(node)
        if up is not None and up > depth:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno} climbs {up} directories from a file {depth} deep")
    return out


def test_no_path_built_from_a_file_leaves_the_repository():
    offenders = [hit for path in _code_files() if path.suffix == ".py" for hit in climbs_out(path, path.read_text())]
    assert offenders == []


def test_no_code_names_a_directory_beside_the_checkout():
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in _code_files()
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if BESIDE.search(line)
    ]
    assert offenders == []


def test_the_check_sees_each_way_out():
    here = ROOT / "tests" / "collectors" / "recorded.py"  # two directories below the root
    ways_out = [
        'F = Path(__file__).resolve().parents[3] / "shared"',
        "F = Path(__file__).parent.parent.parent.parent",
        'F = os.path.join(os.path.dirname(__file__), "..", "..", "..", "x")',
    ]
    for code in ways_out:
        assert climbs_out(here, code), code
    assert not climbs_out(here, 'F = Path(__file__).resolve().parents[2] / "tests" / "fixtures"')
    assert not climbs_out(here, "F = Path(__file__).parent.parent")
    assert BESIDE.search('x = ROOT.parent / "shared" / "fixtures"') and BESIDE.search("see ../shared/scripts")
