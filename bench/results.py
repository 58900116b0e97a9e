"""One row of a benchmark's findings, and the table `bench/run_all.py` prints from all of them."""

from __future__ import annotations

import resource
from dataclasses import dataclass


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
        value = f"{r.value:,.0f}" if abs(r.value) >= 100 else f"{r.value:.3g}"
        ratio = f"{r.ratio:.2f}" if abs(r.ratio) >= 0.01 or r.ratio == 0 else f"{r.ratio:.2g}"  # 0.0038, not 0.00
        lines.append(f"| {r.benchmark} | {r.case} | {value} {r.unit} | {ratio}x {r.baseline} |")
    return "\n".join(lines)


def process_cpu_s() -> float:
    """This process's CPU time so far, user + system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
