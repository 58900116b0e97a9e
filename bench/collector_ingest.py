"""How fast the collector ingests: KV events decoded, attributed and written to SQLite; /metrics bodies parsed.

KV events: `--batches` vLLM-format batches of `--events` events each (BlockStored chains from `--sessions` agent
sessions, then BlockRemoved of older blocks, as a cache under pressure produces), encoded with the wire structs.
Stages, each timed on one thread over the same payloads:

- decode: vLLM's adapter at the door (`kvobs.vllm.normalize.decode`: msgspec, then the normalized events) only:
  the baseline the other stages are compared with;
- decode + attribute: plus `KVIngest` (hash chains, session attribution, rows queued), writer not draining; on the
  compiled ingest core where it is built (`collectors.kv.core`), and each such stage again on the pure-Python core
  (`, pure Python`): the fallback's cost beside it, in the same run; and once with every block hash keyed first
  (`, hashes keyed`: `kvobs collect --hash-key-file`, HMAC-SHA256): what keying costs;
- decode + attribute + SQLite: everything, until the store writer has committed every row (WAL, one file);
- decode + attribute + SQLite, writes in a child process: the same, the store's writes done by a child process
  (`kvobs collect --write-process`; started before the clock, as a collector starts it once);
- decode + attribute + chDB: the same into ClickHouse's engine in-process (`chdb:///dir`, Arrow inserts);
- with `--postgres URL`: decode + attribute + PostgreSQL (COPY), in process and from a child process;
- rows made, SQLite alone / chDB alone: the same block rows, made by the attribution before the clock, written by
  the store with nothing else running (SQLite by the driver's executemany, as a write process does): the store's own
  ceiling with its schema's indexes, which no ingest in front of it can pass.

Each stage also prints the block rows it makes per second (a `BlockStored` of n blocks is n `kv_events` rows), and
the CPU time over the stage (user + system, every thread of the process and of its write process: the writer's,
SQLite's, chDB's own pool; not the PostgreSQL server's) as CPU cores busy and CPU microseconds per event: on a
2-core machine, a stage whose CPU per event times the target rate exceeds 2 core-seconds a second cannot reach it
however its threads overlap.

Scrape: the recorded vLLM 0.32 `/metrics` body (cut to `--lines` lines at a family boundary) parsed with
prometheus_client alone (baseline), then `parse_metrics` (checks, legacy names), then parse + derive.

With `--tier placeholder|self-describing|all`, the stream carries a CPU tier's events too, as vLLM's offloading
connector sends them beside the cache's (each store written through to the tier, the tier dropping its oldest
copies): the same stages over it (`all`: without a tier, then with each form).

With `--baseline REF` (`bench/baseline.py`), the same flags run again at git REF after this run, and each KV stage's
rate is given against REF's (the code before a change, on the same machine minutes apart).

    python bench/collector_ingest.py [--batches 2000] [--events 50] [--lines 600] [--repeats 3] [--postgres URL]
        [--tier none|placeholder|self-describing|all] [--stages WORD...] [--baseline REF]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

from baseline import against, at_commit, baseline_argv  # bench/ is on sys.path when a script in it runs
from prometheus_client.parser import text_string_to_metric_families
from results import Result, process_cpu_s, record  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

from collectors.kv.core import load
from collectors.kv.ingest import KVIngest
from collectors.metrics.derive import Deriver
from collectors.metrics.prom_text import parse_metrics
from kvobs.hash_key import HashKey
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import KVEventColumns
from kvobs.store.sql.write_process import WriteProcess
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode

WRITE_PROCESS = ", writes in a child process"  # kvobs collect --write-process
PURE = ", pure Python"  # the stage on the pure-Python ingest core (the others: the compiled one where built)
KEYED = ", hashes keyed"  # every block hash keyed before the ingest (`kvobs collect --hash-key-file`)
STORE_ALONE = "rows made, "  # the store's own ceiling: the rows made before the clock, written with nothing else
RECORDED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.32-cpu" / "metrics"


SCRAPE_STAGES = ["prometheus_client parse", "parse_metrics", "parse_metrics + derive"]  # the first: the baseline
TIERS = ("none", "placeholder", "self-describing")  # a CPU tier's events beside the cache's, as vLLM's connector sends


def synthetic_payloads(
    num_batches: int,
    per_batch: int,
    sessions: int,
    seed: int = 0,
    tier: str = "none",
    *,
    every_s: float = 0.01,
    session_stores: int = 0,
) -> tuple[list[bytes], int]:
    """`tier`: with a CPU tier written through (vLLM's offloading connector), each store is followed by the tier's
    (placeholders: one event a hash; self-describing: the chain again), and the tier drops its oldest copies (LRU)
    as the cache does. Batches are `every_s` apart; with `session_stores`, a session ends after that many stores and a
    new one takes its place (agents come and go), else the same `sessions` run throughout."""
    rng = random.Random(seed)
    payloads, resident, copies, total = [], [], [], 0
    tips: dict[str, int | None] = {f"sess-{i:03d}": None for i in range(sessions)}
    made: dict[str, int] = dict.fromkeys(tips, 0)
    for b in range(num_batches):
        events: list[wire.Event] = []
        while len(events) < per_batch:
            if resident and rng.random() < 0.45:
                events.append(wire.BlockRemoved(block_hashes=[resident.pop(0)], medium="GPU", group_idx=0))
                if copies and tier != "none":
                    events.append(wire.BlockRemoved(block_hashes=[copies.pop(0)], medium="CPU", group_idx=0))
                continue
            session = rng.choice(list(tips))
            if session_stores and made[session] >= session_stores:
                del tips[session], made[session]
                session = f"{session.split('.')[0]}.{b}"
                tips[session], made[session] = None, 0
            made[session] += 1
            hashes = [rng.getrandbits(64) for _ in range(rng.randint(1, 4))]
            stored = wire.BlockStored(
                block_hashes=hashes,
                parent_block_hash=tips[session],
                token_ids=[1] * 16 * len(hashes),
                block_size=16,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                session_id=session,
            )
            events.append(stored)
            if tier == "placeholder":
                events += [wire.BlockStored([h], None, [], 0, None, "CPU", None, group_idx=0) for h in hashes]
            elif tier == "self-describing":
                events.append(wire.BlockStored(hashes, tips[session], stored.token_ids, 16, None, "CPU", None))
            tips[session] = hashes[-1]
            resident += hashes
            copies += hashes if tier != "none" else []
        total += len(events)
        payloads.append(wire.encode_batch(wire.KVEventBatch(1.8e9 + b * every_s, events, 0)))
    return payloads, total


STORES = {"SQLite": "sqlite:///{dir}/kv-{run}-{n}.db", "chDB": "chdb:///{dir}/kv-{run}-{n}.ch"}


def time_kv(stage: str, payloads: list[bytes], store_dir: Path, run: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds, the write process's included) of one stage over every payload: `stage`
    ends with the store's name (`STORES`), and `WRITE_PROCESS` for writes in a child process; one starting with
    `STORE_ALONE` writes the payloads' rows, made before the clock."""
    name = stage.removeprefix(STORE_ALONE).removesuffix(" alone").split(" + ")[-1].split(",")[0]
    # a store of its own for each stage and run (named by a hash of the stage's name, not its length)
    url = STORES[name].format(dir=store_dir, run=run, n=zlib.crc32(stage.encode())) if name in STORES else None
    made = made_rows(payloads).kept if stage.startswith(STORE_ALONE) else None
    store = open_store(url) if url else None
    if url and url.startswith("postgresql"):
        _emptied(store)
    if made is not None and hasattr(store, "write_alone"):
        store.write_alone()  # (SQL stores: the driver's executemany, as the write process writes)
    writes = WriteProcess(url) if url and stage.endswith(WRITE_PROCESS) else None  # started before the clock
    writer = StoreWriter(writes or store, max_queue=10_000_000) if store else _NullWriter()
    core = load("python" if stage.endswith(PURE) else None)
    ingest = KVIngest(writer, instance="bench", core=core) if "attribute" in stage else None
    key = HashKey(b"the bench's secret, 32 bytes....") if stage.endswith(KEYED) else None
    child = writes._process.pid if writes is not None and writes._process is not None else None
    child_cpu = _cpu(child)
    cpu, start = process_cpu_s(), time.perf_counter()
    if made is not None:
        for columns in made:
            writer.add_many(columns)
    else:
        for seq, payload in enumerate(payloads):
            batch = decode(payload).batch
            if key is not None:
                batch = key.batch(batch)
            if ingest is not None:
                ingest.on_batch(seq, batch)
    if store is not None:
        writer.close(timeout_s=600)
    wall, cpu = time.perf_counter() - start, process_cpu_s() - cpu + _cpu(child) - child_cpu
    if store is not None:
        _check_lossless(stage, store, payloads)
    if writes is not None:
        writes.close()
    if store is not None:
        store.close()
    return wall, cpu


def _check_lossless(stage: str, store, payloads: list[bytes]) -> None:
    """Every block row the payloads make is in the store (its per-minute rollup, which counts each row written), or
    the stage's rate is no rate."""
    counts = store.reads.kv_event_counts(bucket_s=3600.0)
    stored, made = int(counts["events"].sum()) if len(counts) else 0, _rows_made(tuple(payloads))
    if stored != made:
        raise RuntimeError(f"{stage}: not lossless: {stored:,} of {made:,} block rows stored")


@functools.lru_cache(maxsize=4)
def _rows_made(payloads: tuple[bytes, ...]) -> int:
    return made_rows(list(payloads), keep=False).kv_rows


def _emptied(store) -> None:
    """Every table of a PostgreSQL store given with --postgres emptied, so each run starts from none."""
    from sqlalchemy import text

    from kvobs.store.schema import ROLLUPS, TABLES

    tables = [*TABLES, *ROLLUPS]  # (both keyed by table name)
    with store.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(tables)}"))


def _cpu(pid: int | None) -> float:
    """A child process's CPU seconds so far (user + system, from Linux's /proc/PID/stat); 0 without one."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def made_rows(payloads: list[bytes], *, keep: bool = True, core=None) -> _NullWriter:
    """The `kv_events` rows the payloads make (the same in every stage and core), counted and, with `keep`, kept."""
    writer = _NullWriter(keep=keep)
    ingest = KVIngest(writer, instance="bench", core=core)
    for seq, payload in enumerate(payloads):
        ingest.on_batch(seq, decode(payload).batch)
    return writer


class _NullWriter:
    """Takes records and drops them (counting `kv_events` rows): the attribution stage's cost without the store's."""

    def __init__(self, *, keep: bool = False) -> None:
        self.kv_rows = 0
        self.kept: list[KVEventColumns] | None = [] if keep else None  # the rows, to write them later

    def add(self, records, **_) -> bool:
        return True

    def add_many(self, records, **_) -> bool:
        if isinstance(records, KVEventColumns):
            self.kv_rows += len(records)
            if self.kept is not None:
                self.kept.append(records)
        return True

    insert_missing = upsert = add


def scrape_body(lines: int) -> str:
    """The first `lines` of the recorded vLLM run's last scrape (its every metric family has samples by then)."""
    text = max(RECORDED.glob("scrape_*.txt")).read_text().splitlines(keepends=True)
    cut = lines
    while cut < len(text) and not text[cut].startswith("# HELP"):
        cut += 1  # end at a family boundary so the body stays whole
    return "".join(text[:cut])


def time_scrape(stage: str, body: str, n: int) -> float:
    deriver = Deriver()
    start = time.perf_counter()
    for _ in range(n):
        if stage == "prometheus_client parse":
            list(text_string_to_metric_families(body))
        elif stage == "parse_metrics":
            parse_metrics(body)
        else:
            deriver.derive("bench", parse_metrics(body))
    return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload_arguments(parser)
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="also time PostgreSQL, in process and from a child process: a database of its own (its kvobs tables are "
        "emptied before each run), e.g. postgresql://postgres@127.0.0.1/kvobs_bench",
    )
    parser.add_argument(
        "--tier",
        choices=(*TIERS, "all"),
        default="none",
        help="a CPU tier's events in the stream too (vLLM's offloading connector: placeholders or self-describing); "
        "all: each, and none, in turn",
    )
    parser.add_argument(
        "--stages",
        nargs="+",
        metavar="WORD",
        help="run only the stages whose name holds one of these words (any case), beside each table's baseline "
        "(decode; prometheus_client parse), for a cheap A/B: e.g. --stages chDB, --stages 'attribute +' parse_metrics",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run this benchmark, with the same flags, at git REF (the code before a change) after this run, and "
        "give each KV stage's rate against REF's instead of against decode",
    )
    args = parser.parse_args(argv)
    if args.postgres:
        STORES["PostgreSQL"] = args.postgres
    rows = []
    for tier in TIERS if args.tier == "all" else (args.tier,):
        rows += kv_stages(args, tier)
    if not args.stages or len(chosen(SCRAPE_STAGES, args.stages)) > 1:
        rows += scrape_stages(args)
    if args.baseline:
        rates = at_commit(args.baseline, Path(__file__).name, baseline_argv(sys.argv[1:] if argv is None else argv))
        rows = against(rows, args.baseline, rates, what="KV events (events/s)", unit="events/s")
    return rows


def workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The KV-event workload's flags (`synthetic_payloads`), shared with `bench/ingest_profile.py`."""
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--events", type=int, default=50, help="events a batch")
    parser.add_argument("--sessions", type=int, default=64)


def kv_stages(args: argparse.Namespace, tier: str) -> list[Result]:
    payloads, total = synthetic_payloads(args.batches, args.events, args.sessions, tier=tier)
    stages = [
        "decode",
        "decode + attribute",
        f"decode + attribute{PURE}",
        f"decode + attribute{KEYED}",
        "decode + attribute + SQLite",
        f"decode + attribute + SQLite{PURE}",
        f"decode + attribute + SQLite{WRITE_PROCESS}",
        "decode + attribute + chDB",
        f"decode + attribute + chDB{PURE}",
    ]
    if args.postgres:
        stages += ["decode + attribute + PostgreSQL", f"decode + attribute + PostgreSQL{WRITE_PROCESS}"]
    stages += [f"{STORE_ALONE}{name} alone" for name in STORES]
    stages = chosen(stages, args.stages)
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in stages}
    with tempfile.TemporaryDirectory() as tmp:
        for run in tqdm(range(args.repeats), desc="KV events", unit="round"):
            for stage in stages:
                times[stage].append(time_kv(stage, payloads, Path(tmp), run))
    num_rows = made_rows(payloads).kv_rows
    base = statistics.median(wall for wall, _ in times["decode"])
    with_tier = "" if tier == "none" else f", a CPU tier's events among them ({tier})"
    core = load()
    print(
        f"\nKV events: {total:,} events ({num_rows:,} block rows) in {len(payloads):,} batches{with_tier}, median of "
        f"{args.repeats}; CPU: the process's and its write process's, every thread; ingest core: {core.name}"
        + ("" if core.compiled else f" (as {core.why})")
    )
    print(
        f"{'stage':<58} {'events/s':>12} {'block rows/s':>13} {'time vs decode':>15} {'rate vs decode':>15} "
        f"{'CPU cores busy':>15} {'CPU us/event':>13}"
    )
    rows = []
    for stage in stages:
        t, cpu = sorted(times[stage])[len(times[stage]) // 2]  # the median run by wall time, with its CPU
        print(
            f"{stage:<58} {total / t:>12,.0f} {num_rows / t:>13,.0f} {t / base:>14.2f}x {base / t:>14.1%} "
            f"{cpu / t:>15.2f} {cpu / total * 1e6:>13.2f}"
        )
        what = f"KV events: {stage}" + ("" if tier == "none" else f" (CPU tier: {tier})")
        rows.append(Result("collector_ingest", what, total / t, "events/s", base / t, "decode only"))
    return rows


def chosen(stages: list[str], words: list[str] | None) -> list[str]:
    """The stages whose name holds one of `words` (any case), the baseline (the first stage) always first; every
    stage without `words`."""
    if not words:
        return stages
    picked = [s for s in stages[1:] if any(w.lower() in s.lower() for w in words)]
    return [stages[0], *picked]


def scrape_stages(args: argparse.Namespace) -> list[Result]:
    rows = []
    body = scrape_body(args.lines)
    n = 200
    scrape_stages = chosen(SCRAPE_STAGES, args.stages)
    results = {s: statistics.median(time_scrape(s, body, n) for _ in range(args.repeats)) for s in scrape_stages}
    print(f"\n/metrics body: {body.count(chr(10))} lines (recorded vLLM 0.32), median of {args.repeats} x {n} parses")
    print(f"{'stage':<30} {'ms/scrape':>12} {'vs prometheus_client':>21}")
    for stage in scrape_stages:
        print(f"{stage:<30} {results[stage] * 1000:>12.2f} {results[stage] / results[scrape_stages[0]]:>20.2f}x")
        rows.append(
            Result(
                "collector_ingest",
                f"/metrics: {stage}",
                results[stage] * 1000,
                "ms",
                results[stage] / results[scrape_stages[0]],
                "prometheus_client parse",
            )
        )
    return rows


if __name__ == "__main__":
    record(main)
