"""`kvobs whatif` as a user runs it: a process of its own over a store."""

from __future__ import annotations

import subprocess
import sys


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
