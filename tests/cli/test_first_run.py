"""A new user's first mistakes get a useful answer: a misspelt SQLite store is refused by the commands that only
read it (instead of a new empty store that shows nothing), and a misspelt flag prints that command's usage."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _kvobs(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvobs.cli", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)  # fmt: skip


@pytest.mark.parametrize("command", [["alerts"], ["whatif", "--num-blocks", "64"], ["dashboard"]])
def test_readers_refuse_a_sqlite_store_that_does_not_exist(tmp_path, command):
    done = _kvobs(*command, "--store", "sqlite:///kvosb.db", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no store at sqlite:///kvosb.db" in lines[0] and "does not exist" in lines[0]
    assert not (tmp_path / "kvosb.db").exists()  # nothing created


def test_a_misspelt_flag_prints_the_commands_own_usage(tmp_path):
    done = _kvobs("demo", "--sesions", "3", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kvobs demo") and "unrecognized arguments: --sesions 3" in done.stderr
