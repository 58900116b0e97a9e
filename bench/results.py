"""One row of a benchmark's findings, the table `bench/run_all.py` prints from all of them, and the results file
each run writes (`bench/results/NAME.md`: the command, the date, the machine and the table), which the docs site's
Benchmarks page includes: a figure is quoted from there, never restated in prose.

    if __name__ == "__main__":
        record(main)        # a benchmark's own command line: runs it, writes bench/results/NAME.md
"""

from __future__ import annotations

import datetime
import os
import platform
import resource
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# where results files go: bench/results, which the docs include (the tests point it at a directory of their own)
RESULTS_DIR = Path(os.environ.get("KVOBS_BENCH_RESULTS_DIR") or Path(__file__).resolve().parent / "results")
DETAILS: dict[str, str] = {}  # benchmark -> a table of its own its results file holds below the common one


def detail(benchmark: str, text: str) -> None:
    """A table of the benchmark's own (Markdown), written into its results file after the common table."""
    DETAILS[benchmark] = text


@dataclass(frozen=True)
class Result:
    benchmark: str  # the script, e.g. "engine_throughput"
    case: str  # what was measured, e.g. "kvobs engine (CPU, fp32)"
    value: float
    unit: str  # "tok/s", "events/s", "s", ...
    ratio: float  # value against `baseline`, measured in the same run
    baseline: str


def table(results: list[Result]) -> str:
    """A Markdown table: benchmark, case, value with its unit, ratio against the run's own baseline."""
    lines = ["| benchmark | case | value | vs baseline |", "|---|---|---|---|"]
    for r in results:
        value = figure(r.value)
        ratio = f"{r.ratio:.2f}" if abs(r.ratio) >= 0.01 or r.ratio == 0 else f"{r.ratio:.2g}"  # 0.0038, not 0.00
        lines.append(f"| {r.benchmark} | {r.case} | {value} {r.unit} | {ratio}x {r.baseline} |")
    return "\n".join(lines)


def figure(value: float) -> str:
    """A value as the tables show it: whole with thousands' commas from 100 on, else three significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def process_cpu_s() -> float:
    """This process's CPU time so far, user + system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine() -> str:
    """This machine in one line: CPU model, logical cores, memory, OS and Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
        with open("/proc/meminfo") as f:
            memory = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB"
    except OSError:
        memory = "memory unknown"
    system = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    return f"{model}, {os.cpu_count()} logical cores, {memory}, {system}"


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=RESULTS_DIR.parent
    )
    return done.stdout.strip() or "unknown"


def write(benchmark: str, results: list[Result], command: str, *, to: Path = RESULTS_DIR) -> Path:
    """`to/BENCHMARK.md`: what was run, when (local time with its zone), where, at which commit, and the table."""
    to.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    text = (
        f"`{command}`\n\n"
        f"- date: {when}\n- machine: {machine()}\n- commit: {_commit()}\n\n"
        f"{table([r for r in results if r.benchmark == benchmark] or results)}\n"
    )
    if benchmark in DETAILS:
        text += f"\n{DETAILS[benchmark]}\n"
    path = to / f"{benchmark}.md"
    path.write_text(text)
    return path


def record(main: Callable[[], list[Result]]) -> list[Result]:
    """Run a benchmark's `main` on its own command line and write its results file."""
    results = main()
    script = Path(sys.argv[0]).name
    command = shlex.join([".venv/bin/python", f"bench/{script}", *sys.argv[1:]])
    write(Path(script).stem, results, command)
    return results
