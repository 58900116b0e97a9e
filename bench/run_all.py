"""Run every benchmark under bench/ and print one table of their findings (each ratio against a baseline measured
in the same run: transformers for the engine, telemetry off, decode only, prometheus_client's parser, count(*)).

    .venv/bin/python bench/run_all.py            # the full sizes: bench/results/*.md, which docs/benchmarks.md includes
    .venv/bin/python bench/run_all.py --quick    # small sizes: a smoke run of every benchmark (about 2 minutes)
    .venv/bin/python bench/run_all.py --only collector_ingest --only dashboard_queries

Each benchmark also prints its own detailed table as it finishes.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import tempfile
import time

from results import Result, table, write  # bench/ is on sys.path when a script in it runs

log = logging.getLogger("bench")

BENCHMARKS = (
    "engine_throughput",
    "ttft_by_source",
    "block_manager",
    "fleet_index",
    "telemetry_overhead",
    "collector_ingest",
    "ingest_profile",
    "core_slice",
    "collector_burst",
    "collector_workers",
    "span_steps",
    "ownership",
    "collector_memory",
    "block_registry",
    "rollup_writes",
    "dashboard_queries",
    "whatif_fidelity",
)


def arguments(name: str, quick: bool, workdir: str) -> list[str]:
    """Each benchmark's own flags: its defaults, or small sizes with --quick."""
    if not quick:
        return []
    sizes = {
        "engine_throughput": ["--prompts", "2", "--prompt-tokens", "48", "--new-tokens", "8", "--dtypes", "float32"],
        "ttft_by_source": ["--lengths", "32,64", "--repeats", "1"],
        "telemetry_overhead": ["--sessions", "4", "--new-tokens", "4", "--repeats", "1"],
        "block_manager": ["--requests", "200", "--repeats", "1"],
        "fleet_index": ["--events", "20000", "--replicas", "4", "--capacity", "512"],
        "collector_ingest": ["--batches", "40", "--events", "25", "--lines", "100", "--repeats", "1"],
        "ingest_profile": ["--batches", "40", "--events", "25", "--repeats", "1"],
        "collector_burst": ["--rate", "1000", "--burst-s", "2", "--calm-s", "1"],
        "core_slice": ["--batches", "40", "--events", "25", "--repeats", "1", "--memory-blocks", "20000"],
        "collector_workers": ["--batches", "40", "--events", "25", "--repeats", "1", "--stores", "SQLite"],
        "span_steps": ["--conversations", "50", "--steps", "3", "--repeats", "1"],
        "ownership": ["--copies", "5"],
        "collector_memory": ["--sessions", "2000", "--session-idle-s", "5", "--report-every", "500"],
        "block_registry": ["--blocks", "20000", "--rebuild-rows", "20000"],
        "rollup_writes": ["--seconds", "120", "--instances", "2", "--requests", "500", "--repeats", "1"],
        "dashboard_queries": ["--sizes", "sqlite:2000", "sqlite:5000", "--repeats", "1", "--dir", workdir],
        "whatif_fidelity": [],  # (every recording: a few seconds)
    }
    return sizes[name]


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: check every benchmark runs")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, help="run just these (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: list[Result] = []
    timings = []
    with tempfile.TemporaryDirectory(prefix="kvobs-bench-") as workdir:
        for name in args.only or BENCHMARKS:
            log.info("\n== %s ==", name)
            start = time.perf_counter()
            argv = arguments(name, args.quick, workdir)
            found = importlib.import_module(name).main(argv)
            write(
                name,
                found,
                " ".join([".venv/bin/python bench/run_all.py", *(["--quick"] if args.quick else []), "--only", name]),
            )
            results += found
            timings.append(f"{name} {time.perf_counter() - start:.0f} s")
    print(f"\nAll benchmarks{' (--quick sizes)' if args.quick else ''}: {', '.join(timings)}\n")
    print(table(results))
    return results


if __name__ == "__main__":
    main()
