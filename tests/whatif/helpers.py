"""What the what-if tests share: `kvobs whatif` as a user runs it (a process of its own over a store), and a copy of
a run's SQLite store with statements applied."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

from kvobs.store import open_store


def whatif(url: str, *args: str) -> str:
    """`kvobs whatif --store URL ARGS...`'s output; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "whatif", "--store", url, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def altered_copy(run, directory, *statements: str):
    """A copy of `run`'s SQLite store (anything with its `url`) in `directory`, `statements` run on it."""
    path = directory / "altered.db"
    with sqlite3.connect(run.url.removeprefix("sqlite:///")) as source, sqlite3.connect(path) as copy:
        source.backup(copy)
        for statement in statements:
            copy.execute(statement)
    return open_store(f"sqlite:///{path}")
