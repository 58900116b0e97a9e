"""Bad input a user can type: one line on stderr naming the flag, exit status 2, no traceback, no hang, and nothing
created (no store file, no chDB directory), each checked before anything heavy (a model load, a store) starts."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

HUGE = "99999999999"


def _kvobs(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvobs.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


CASES = [
    (["whatif", "--num-blocks", HUGE, "--store", "sqlite:///s.db"], "--num-blocks 99,999,999,999 would need about"),
    (["whatif", "--num-blocks", "64", "--block-size", "0", "--store", "sqlite:///s.db"], "--block-size: must be at"),
    (["whatif", "--num-blocks", "64", "--policy", "session_ttl", "--ttl", "-3"], "argument --ttl: must be at least 0"),
    (["alerts", "--watch", "-1", "--store", "sqlite:///s.db"], "argument --watch: must be more than 0; got -1"),
    (["alerts", "--store", "chdb:///no-such-dir"], "no store at chdb:///no-such-dir:"),
    (["whatif", "--num-blocks", "64", "--store", "chdb:///no-such-dir"], "no store at chdb:///no-such-dir:"),
    (["doctor", "--store", "chdb:///no-such-dir"], "no store at chdb:///no-such-dir:"),
    (["alerts", "--store", "clickhouse://127.0.0.1:1/db"], "ClickHouse at 127.0.0.1:1 cannot be reached: connection"),
    (["serve", "--num-blocks", "512", "--port", "0"], "--num-blocks 512 of 16 tokens cannot hold one sequence of the"),
    (["serve", "--num-blocks", "64", "--port", "0", "--store", "sqlite:///s.db"], "pass --num-blocks 513 or more, or"),
    (["serve", "--max-model-len", "9000", "--port", "0"], "--max-model-len 9,000 exceeds this model's context of"),
    (["serve", "--num-blocks", HUGE, "--max-model-len", "512", "--port", "0"], "would need about"),
    (["serve", "--block-size", "0", "--port", "0"], "argument --block-size: must be at least 1; got 0"),
    # a port is a port, on every command that listens: one line, not a socket's OverflowError
    (["serve", "--port", "70000"], "argument --port: a port is 0-65535; got 70000"),
    (["dashboard", "--port", "-1", "--store", "sqlite:///s.db"], "argument --port: a port is 0-65535; got -1"),
    (["demo", "--dashboard-port", "65536"], "argument --dashboard-port: a port is 0-65535; got 65536"),
    (["demo", "--collector-port", "soon"], "argument --collector-port: not a port: 'soon' (0-65535)"),
    (["collect", "--otlp-http", "127.0.0.1:99999"], "argument --otlp-http: a port is 0-65535; got 127.0.0.1:99999"),
    (["collect", "--otlp-grpc", "0.0.0.0:-1"], "argument --otlp-grpc: expected HOST:PORT; got '0.0.0.0:-1'"),
    (["collect", "--metrics-address", "[::1]:70000"], "argument --metrics-address: a port is 0-65535; got [::1]"),
    # a store the engine cannot open is said with its URL before the weights load
    (
        ["serve", "--port", "0", "--store", "sqlite:////no-such-dir/x.db"],
        "kvobs serve: cannot reach the store sqlite:////no-such-dir/x.db: unable to open database file",
    ),
]


@pytest.mark.parametrize("args, message", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, args, message):
    done = _kvobs(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if not line.startswith("INFO ")]  # (log lines of the start)
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr and "WARNING" not in done.stderr  # no library's retry noise first
    assert list(tmp_path.iterdir()) == []  # no store file, no chDB directory, no kvobs.db


def test_collect_names_the_flag_of_a_taken_port_before_it_makes_a_store(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _kvobs("collect", "--otlp-http", f"127.0.0.1:{port}", "--store", "sqlite:///s.db", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"kvobs collect: already in use: 127.0.0.1:{port} (--otlp-http); another kvobs collect? stop it or pass "
        "other addresses"
    ]
    assert list(tmp_path.iterdir()) == []
