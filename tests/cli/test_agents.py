"""`kvobs agents` as a user runs it: bad flags and an unreachable server end in one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.server.conftest import free_port


@pytest.mark.parametrize(("flags", "message"), [
    (["--sessions", "0"], "--sessions must be at least 1"),
    (["--tool-pause-ms", "soon"], "not a pause distribution: 'soon'"),
    (["--tool-pause-ms", "uniform:900-100"], "the upper bound is below the lower one"),
    (["--step-deadline-s", "-1"], "--step-deadline-s must be positive"),
    ([], "cannot reach http://127.0.0.1:"),
])  # fmt: skip
def test_bad_flags_and_unreachable_server_exit_2(tmp_path, flags, message):
    done = subprocess.run([sys.executable, "-m", "kvobs.cli", "agents", "--base-url", f"http://127.0.0.1:{free_port()}",
                           "--store", f"sqlite:///{tmp_path / 's.db'}", "--no-progress", *flags],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
