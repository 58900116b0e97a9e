"""The first hour, timed: `scripts/install.sh` in a fresh clone of this repository in an empty directory (as a new
user and CI run it), each stage's seconds from its own stage lines, then `kvobs demo --exit-when-done` in that clone:
the time to its dashboard, its first round, and what the round said. `--busy N` keeps N busy loops running the
whole time (a machine busy with other work); the load average before and after is in each case's name. The
README's figures and the install's own estimate of its C++ stage are read from the results file this writes.

    .venv/bin/python bench/install.py                      # quiet, then with a busy loop on each core
    .venv/bin/python bench/install.py --busy 0 --extras all,test

Wall-clock seconds; pip's cache is off (`PIP_NO_CACHE_DIR`), so each run downloads as a first install does.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import Result, record  # bench/ is on sys.path when a script in it runs

ROOT = Path(__file__).resolve().parents[1]
STAGE = re.compile(r"^\[install (\d+) s\] (.*)$")
# each stage line's start -> the case it is measured as (the install's own `measured` reads these names)
STAGES = {
    "1/5 ": "1/5 virtual environment",
    "2/5 ": "2/5 PyTorch, CPU build",
    "3/5 ": "3/5 SmolLM2 weights",
    "4/5 ": "4/5 kvobs and its extras",
    "5/5 ": "5/5 C++ CPU operations",
    "the collector's compiled ": "the compiled KV ingest core",
    "the tests' ": "test environments",
}
ROUND = re.compile(r"(\d+) steps in (\d+) s; prefix cache hit rate: ([\d.]+)%")
FAILED = re.compile(r"failed steps: (\d+)")
DEADLINE = re.compile(r"a step deadline of ([\d.]+) s")


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", default=f"0,{os.cpu_count() or 1}", help="busy loops beside each run, e.g. 0,2")
    parser.add_argument("--extras", default="all", help="scripts/install.sh's extras (its default: all)")
    parser.add_argument("--no-demo", action="store_true", help="time the install only")
    args = parser.parse_args(argv)
    results: list[Result] = []
    for busy in (int(n) for n in args.busy.split(",")):
        results += one_run(busy, args.extras, demo=not args.no_demo)
    return results


def one_run(busy: int, extras: str, *, demo: bool) -> list[Result]:
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        with tempfile.TemporaryDirectory(prefix="kvobs-first-hour-") as empty:
            clone = Path(empty) / "kvobs"
            subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(clone)], check=True)
            before = _load()
            stages, total = _install(clone, extras)
            demo_figures = _demo(clone) if demo else {}
            after = _load()
    finally:
        for loop in loops:
            loop.kill()
    where = f"extras {extras}, {busy} busy loops, load {before:.1f} to {after:.1f}"
    out = [
        Result("install", f"{name} ({where})", seconds, "s", seconds / total, "whole install")
        for name, seconds in stages
    ]
    out.append(Result("install", f"whole install ({where})", total, "s", 1.0, "whole install"))
    if demo_figures:
        up, round_s = demo_figures["up_s"], demo_figures["round_s"]
        out.append(Result("install", f"demo: start to its dashboard ({where})", up, "s", up / total, "whole install"))
        out.append(
            Result("install", f"demo: its first round ({where})", round_s, "s", round_s / total, "whole install")
        )
        for key, unit in (("deadline_s", "s"), ("failed", "steps"), ("hit_rate", "%")):
            out.append(Result("install", f"demo: {key.replace('_s', '')} ({where})", demo_figures[key], unit, 1.0, "-"))
    return out


def _install(clone: Path, extras: str) -> tuple[list[tuple[str, float]], float]:
    """Each stage's seconds (from one stage line to the next) and the whole install's."""
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1"}
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "scripts/install.sh", extras], cwd=clone, env=env, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    marks: list[tuple[str, float]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        match = STAGE.match(line.strip())
        if match:
            marks.append((match.group(2), time.monotonic() - started))
    if proc.wait():
        raise RuntimeError(f"scripts/install.sh {extras} failed ({proc.returncode})")
    total = time.monotonic() - started
    seconds: dict[str, float] = {}
    for (text, at), (_, after) in zip(marks, marks[1:]):
        name = next((case for start, case in STAGES.items() if text.startswith(start)), None)
        if name is not None:
            seconds[name] = seconds.get(name, 0.0) + after - at
    return list(seconds.items()), total


def _demo(clone: Path) -> dict[str, float]:
    """`kvobs demo --exit-when-done` in the clone, on free ports: when its dashboard was up, its round's figures."""
    ports = [str(_free_port()) for _ in range(3)]
    command = [str(clone / ".venv" / "bin" / "kvobs"), "demo", "--exit-when-done", "--seed", "5"]
    command += ["--port", ports[0], "--dashboard-port", ports[1], "--collector-port", ports[2]]
    started = time.monotonic()
    proc = subprocess.Popen(command, cwd=clone, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    figures: dict[str, float] = {}
    round_started = None
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        now = time.monotonic() - started
        if "kvobs demo is up" in line:
            figures["up_s"] = now
        if line.startswith("Round 1:"):
            round_started = now
            figures["deadline_s"] = float(DEADLINE.search(line).group(1))
        if (found := ROUND.search(line)) and round_started is not None:
            figures["round_s"], figures["hit_rate"] = now - round_started, float(found.group(3))
        if (found := FAILED.search(line)) and "failed" not in figures:
            figures["failed"] = float(found.group(1))
    if proc.wait() or len(figures) < 5:
        raise RuntimeError(f"kvobs demo exited {proc.returncode} with {figures}")
    return figures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


if __name__ == "__main__":
    record(main)
