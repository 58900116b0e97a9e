"""A new user's first mistakes get a useful answer: a misspelt SQLite store is refused by the commands that only
read it (instead of a new empty store that shows nothing), a misspelt flag prints that command's usage, a taken port
stops a server in one line before it loads anything or creates a store, `--help` shows each flag's default, and
`kvobs alerts` says what it evaluated when nothing changed."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from kvobs.cli import build_parser


def _kvobs(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvobs.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


@pytest.mark.parametrize(
    "command", [["alerts"], ["whatif", "--num-blocks", "64"], ["report", "--out", "r"], ["dashboard"], ["doctor"]]
)
def test_readers_refuse_a_sqlite_store_that_does_not_exist(tmp_path, command):
    done = _kvobs(*command, "--store", "sqlite:///kvosb.db", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no store at sqlite:///kvosb.db" in lines[0] and "does not exist" in lines[0]
    assert not (tmp_path / "kvosb.db").exists()  # nothing created


def test_a_misspelt_flag_is_one_line_that_names_the_flag_it_may_have_meant(tmp_path):
    done = _kvobs("demo", "--sesions", "3", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "kvobs demo: unrecognized arguments: --sesions 3; did you mean --sessions? (kvobs demo --help lists the flags)"
    ]


@pytest.mark.parametrize("command", [["serve", "--num-blocks", "64"], ["dashboard"]])
def test_a_taken_port_stops_a_server_in_one_line_before_any_heavy_work(tmp_path, command):
    """Nothing is loaded and no store file is made: the line comes in well under the model's load time."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        store = tmp_path / "s.db"
        if command[0] == "dashboard":  # the dashboard reads an existing store: make it, empty
            from kvobs.store import open_store

            open_store(f"sqlite:///{store}").close()
        existed = store.exists()
        started = time.monotonic()
        done = _kvobs(*command, "--port", str(port), "--store", f"sqlite:///{store}", cwd=tmp_path)
        took = time.monotonic() - started
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"kvobs {command[0]}: already in use: 127.0.0.1:{port} (--port); another "
        f"{'kvobs serve or vLLM' if command[0] == 'serve' else 'dashboard'}? stop it or pass another "
        "--port"
    ], done.stderr
    assert store.exists() == existed  # serve made no store file
    assert "loading" not in done.stderr and took < 30, took  # no model loaded (that takes seconds on this machine)


def test_serve_refuses_a_taken_kv_event_port_too(tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _kvobs("serve", "--port", "0", "--kv-events-endpoint", f"tcp://*:{port}", cwd=tmp_path)
    assert done.returncode == 2 and f"0.0.0.0:{port} (--kv-events-endpoint)" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_flag_with_a_default_shows_it_in_help():
    commands = build_parser().parse_args(["alerts"])._commands  # every subcommand's parser
    checked = 0
    for name, parser in commands.items():
        for action in parser._actions:
            default = action.default
            if not action.option_strings or default is None or isinstance(default, bool) or default in ([], ""):
                continue  # no default to show (None, an empty list), or a switch (off by default)
            if action.help == "==SUPPRESS==" or default == "==SUPPRESS==":
                continue
            checked += 1
            assert "default" in (action.help or ""), f"kvobs {name} {action.option_strings[0]}: {action.help!r}"
    assert checked > 30
    usage = subprocess.run([sys.executable, "-m", "kvobs.cli", "demo", "--help"], capture_output=True, text=True)
    assert "the engine's port; default: 8000" in " ".join(usage.stdout.split())


def test_alerts_say_what_they_evaluated_when_nothing_changes(tmp_path):
    from kvobs.store import open_store

    open_store(f"sqlite:///{tmp_path / 's.db'}").close()
    done = _kvobs("alerts", "--store", "sqlite:///s.db", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()
    assert first.startswith("kvobs alerts: no change: ") and "rules evaluated at 20" in first
    assert first.rstrip().endswith("over sqlite:///s.db")
    assert second == "firing now: none"
