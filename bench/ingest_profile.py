"""Where the collector's CPU goes per KV event, before the store: the decoder, the hash chains, the block clocks, the
rows' columns and the ingest's own bookkeeping.

The same payloads as `bench/collector_ingest.py` (vLLM-format batches; `--tier` a CPU tier's events among them) are
decoded and attributed (`KVIngest` on the `--core` ingest core, with a writer that drops the rows) once under
cProfile. Each function's own time goes to its component by its source file; a builtin's (a dict's `get`, a list's
`extend`) to the component of the function that called it. The compiled core's methods are not seen by cProfile (a
C extension built without its profiling hooks): on `--core compiled` their time, rows' columns included, is their
callers', the ingest's bookkeeping. The shares are then scaled to the CPU time of the same work measured without the
profiler (the baseline, median of `--repeats`), which the profiler's own overhead would otherwise inflate.

    python bench/ingest_profile.py [--batches 2000] [--events 50] [--tier none|placeholder|self-describing]
        [--core compiled|python]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from collector_ingest import TIERS, made_rows, synthetic_payloads, workload_arguments  # bench/ is on sys.path
from results import Result, record

from collectors.kv.core import load

# (component, the source files whose functions are its own), in the order printed; the first that matches
COMPONENTS = (
    ("decode (the wire's msgpack, then normalized events)", ("kvobs/vllm/", "kvobs/block_events.py", "msgspec")),
    ("hash chains (owners, parents, footprints)", ("collectors/kv/chains.py",)),
    ("block clocks (lifetimes, restores)", ("kvobs/block_clock.py",)),
    (
        "rows' columns (BatchRows, KVEventColumns)",
        ("collectors/kv/batch_rows.py", "kvobs/store/rows.py", "kvobs/store/runs.py"),
    ),
    ("ingest's bookkeeping (dispatch, sessions, tiers)", ("collectors/kv/", "kvobs/semconv/")),
)
OTHER = "other"


def component(func: tuple[str, int, str]) -> str | None:
    """A profiled function's component by its file; None for a builtin (its time goes to its callers')."""
    filename = func[0]
    if filename == "~":
        return None
    for name, files in COMPONENTS:
        if any(part in filename for part in files):
            return name
    return OTHER


def shares(payloads: list[bytes], core) -> dict[str, float]:
    """Each component's share of the profiled time."""
    profile = cProfile.Profile()
    profile.runcall(made_rows, payloads, keep=False, core=core)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]  # (func -> (cc, nc, tt, ct, callers))
    own: dict[str, float] = {}
    for func, (_, _, tottime, _, callers) in stats.items():
        name = component(func)
        if name is not None:
            own[name] = own.get(name, 0.0) + tottime
            continue
        # a builtin: its time, split by what each caller spent in it
        for caller, (_, _, caller_tt, _) in callers.items():
            by = component(caller) or OTHER
            own[by] = own.get(by, 0.0) + caller_tt
    total = sum(own.values())
    return {name: t / total for name, t in own.items()}


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_arguments(parser)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tier", choices=TIERS, default="none")
    parser.add_argument("--core", choices=["compiled", "python"], default="compiled", help="the KV ingest core")
    args = parser.parse_args(argv)
    core = load(args.core)
    if args.core == "compiled" and not core.compiled:
        raise SystemExit(f"the compiled ingest core is not loaded: {core.why}")
    payloads, total = synthetic_payloads(args.batches, args.events, args.sessions, tier=args.tier)
    cpu = []
    for _ in range(args.repeats):
        started = time.process_time()
        made_rows(payloads, keep=False, core=core)
        cpu.append(time.process_time() - started)
    per_event = statistics.median(cpu) / total * 1e6
    split = shares(payloads, core)
    print(
        f"\nKV events: {total:,} in {len(payloads):,} batches (CPU tier: {args.tier}); decode + attribute, one thread; "
        f"ingest core: {core.name}" + (" (its calls' time in the ingest's bookkeeping)" if core.compiled else "")
    )
    print(f"{'component':<52} {'CPU us/event':>13} {'share':>7}")
    rows = [Result("ingest_profile", "decode + attribute, unprofiled", per_event, "µs/event", 1.0, "itself")]
    print(f"{'decode + attribute, unprofiled (the baseline)':<52} {per_event:>13.2f} {1:>7.0%}")
    for name in [c for c, _ in COMPONENTS] + [OTHER]:
        share = split.get(name, 0.0)
        print(f"{name:<52} {share * per_event:>13.2f} {share:>7.0%}")
        if share:  # (a component the run never entered has no row)
            rows.append(Result("ingest_profile", name, share * per_event, "µs/event", share, "decode + attribute"))
    return rows


if __name__ == "__main__":
    record(main)
