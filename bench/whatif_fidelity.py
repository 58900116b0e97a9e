"""Whether the what-if reproduces each recorded run before it predicts: every capture under tests/fixtures that
holds KV events (real vLLM 0.32 CPU runs and `kvobs serve` runs, one replica or two) is imported into a fresh
SQLite store through the collector's own parts (`collectors.capture`), each run replayed at its observed size and
policy (`whatif.fidelity`), and the replay's hit rate set against the run's own (what its responses said, or its
engine's counts). Beside it, the same replay with one approximation changed at a time, to show what each costs:
each request holding its whole length from its lookup (`decode_growth=False`, the rule before decode growth), and
the other engine's rule for when a prompt's blocks become findable (`engine_rules.REGISTERS`: vLLM's at
allocation, kvobs serve's once computed). A run our engine recorded step for step (its allocations) is replayed
as recorded: n/a.

    .venv/bin/python bench/whatif_fidelity.py
    .venv/bin/python bench/whatif_fidelity.py --only vllm-0.32-cpu

A run whose capture scraped no /metrics has no observed size or engine in its store; it is replayed at the size its
recorder gave the server, on the engine it ran (`RECORDERS`, as each recording's README says), and the table says so.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from results import Result, detail, record  # bench/ is on sys.path when a script in it runs

from collectors.capture import KV_EVENTS, OTLP, import_capture
from instrumented_engine.whatif.engine_rules import AT_ALLOCATION, WHEN_COMPUTED, registers_of
from instrumented_engine.whatif.fidelity import WITHIN_POINTS, on_answered, run_fidelity
from instrumented_engine.whatif.replay import simulate
from instrumented_engine.whatif.runs import replay_plans
from kvobs.semconv.spans import RunEngine
from kvobs.store import open_store

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
# the cache size (--num-gpu-blocks-override, kvobs serve --num-blocks) and engine of each capture without scrapes
RECORDERS = {
    "agents/vllm-*-kv": (16, RunEngine.VLLM.value),
    "agents/*-kv-ownership": (34, RunEngine.KVOBS.value),
    "agents/*-openinference": (48, RunEngine.KVOBS.value),  # (agent_harness.served_and_collected's default)
}


def captures() -> list[Path]:
    """Every recording that holds KV events, at its top or in a replica's folder."""
    found = []
    for folder in sorted(p for p in FIXTURES.rglob("*") if p.is_dir()):
        if (folder / KV_EVENTS).exists() and not (folder.parent / OTLP).exists():
            found.append(folder)  # (a replica's folder is its capture's: the exports sit above it)
        elif (folder / OTLP).exists() and any((child / KV_EVENTS).exists() for child in folder.iterdir()):
            found.append(folder)
    return found


def recorder(name: str) -> tuple[int, str] | None:
    """(blocks, engine) the capture's recorder ran its server with, where its store cannot say."""
    return next((said for pattern, said in RECORDERS.items() if Path(name).match(pattern)), None)


def checks(folder: Path) -> list[dict]:
    """Each run of the capture: its check at the observed size, and the whole-length replay's error."""
    name = str(folder.relative_to(FIXTURES))
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/kvobs.db")
        try:
            import_capture(store, folder)
            plans = replay_plans(store)
        finally:
            store.close()
    rows = []
    for plan in plans:
        said_by = "scraped"
        if plan.observed.get("num_blocks") is None and recorder(name) is not None:
            (plan.observed["num_blocks"], plan.engine), said_by = recorder(name), "its recorder"
        check = run_fidelity(plan)
        row = {"capture": name, "run": plan.span.instance or "(no run recorded)", "engine": plan.engine}
        row.update(said_by=said_by, check=check, whole=None, other=None)
        if check.replay is not None and check.observed is not None and plan.recorded is None:
            row["whole"] = error(plan, check, decode_growth=False)
            other = AT_ALLOCATION if registers_of(plan.engine) == WHEN_COMPUTED else WHEN_COMPUTED
            row["other"] = error(plan, check, registers=other)
        rows.append(row)
    return rows


def error(plan, check, **changed) -> float:
    """The error in points of `plan` replayed at the check's size and policy with one approximation `changed`."""
    replay = simulate(plan, num_blocks=check.num_blocks, policy=check.policy, **changed)
    return 100 * (on_answered(replay, plan.observed.get("answered")).hit_rate - check.observed)


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], help="a capture's folder under tests/fixtures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    folders = [f for f in captures() if not args.only or str(f.relative_to(FIXTURES)) in args.only]
    started, rows = time.monotonic(), []
    for folder in folders:
        rows += checks(folder)
    lines = [
        f"{len(rows)} runs of {len(folders)} captures, each replayed at its observed size and policy; the error in "
        "points (replay less observed), then the error with one approximation changed (see the script's doc):",
        "",
        "| capture | run | engine, blocks | observed | replay | error | within 2 | whole length from lookup | the "
        "other engine's rule |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    results = []
    for row in rows:
        check = row["check"]
        if check.error_points is None:
            lines.append(f"| {row['capture']} | {row['run']} | | not checked: {'; '.join(check.reasons)} | | | | | |")
            continue
        said, replayed = check.answered or (check.replay.requests, check.replay.requests)
        counted = f"{said} of {replayed} requests" if said != replayed else f"{replayed} requests"  # what it is over
        observed = f"{100 * check.observed:.1f}% ({check.observed_source}, {counted})"
        whole, other = ("n/a" if row[k] is None else f"{row[k]:+.2f}" for k in ("whole", "other"))
        within = "yes" if abs(check.error_points) <= WITHIN_POINTS else "NO"
        lines.append(
            f"| {row['capture']} | {row['run']} | {row['engine']}, {check.num_blocks} ({row['said_by']}) | {observed} "
            f"| {100 * check.replayed:.1f}% | {check.error_points:+.2f} | {within} | {whole} | {other} |"
        )
        ratio = check.replayed / check.observed if check.observed else float(check.replayed == check.observed)
        case = f"{row['capture']} {row['run']} ({check.num_blocks} blocks)"
        results.append(Result("whatif_fidelity", case, check.error_points, "points", ratio, f"observed {observed}"))
    print(f"\n{chr(10).join(lines)}\n\n(checked in {time.monotonic() - started:.1f} s)")
    detail("whatif_fidelity", "\n".join(lines))
    return results


if __name__ == "__main__":
    record(main)
