"""`kvobs doctor`: is the pipeline whole? Per replica: do its KV events and its own counters agree (from the store);
per agent convention: were the steps made of its spans tied to their server requests (most must be); do the agents'
replies say how many prompt tokens were cached (vLLM's prompt-token details are off by default); which sessions miss
at their prompt's first block because it changes on every call; and, given
the collector's /metrics, which wire shape each replica sends, how late its batches arrive, how many were lost.

kvobs doctor --store sqlite:///kvobs.db                                  # the store's checks
kvobs doctor --store URL --collector http://collector:9400/metrics        # and the collector's

Exit 0 when every check passes, 1 when one does not (each says why), 2 when the store or the collector cannot be
read.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from kvobs.commands.common import add_store_flag, start_or_report
from kvobs.semconv.metrics import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MEDIUM,
    LABEL_OUTCOME,
    LABEL_REASON,
    LABEL_SHAPE,
    LABEL_TIE,
    LABEL_WORKER,
    kvobs_metrics,
)
from kvobs.semconv.reasons import PairApart
from kvobs.semconv.spans import TraceJoin

LAG_WARN_S = 5.0  # a batch older than this when it arrives: a slow path or a skewed clock


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check the pipeline: KV events against counters, wire shapes, lag, gaps")
    add_store_flag(p)
    p.add_argument("--collector", metavar="URL", help="a collector's /metrics (its --metrics address)")
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="check from this time (default: everything)")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="... up to this time")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from kvobs.analytics.cache import changing_starts, kv_counter_agreement, tier_checks, token_details_check
    from kvobs.analytics.steps import source_joins
    from kvobs.store import open_store

    store = start_or_report("doctor", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    try:
        checks = kv_counter_agreement(store, args.since, args.until)
        tiers = tier_checks(store, args.since, args.until)
        joins = source_joins(store, args.since, args.until)
        details = token_details_check(store, args.since, args.until)
        starts = changing_starts(store, args.since, args.until)
        leases = store.leases.current()
    finally:
        store.close()
    now = time.time()
    print("Who writes each replica (collectors' leases in the store):")
    for lease in leases:
        print(f"  - {lease.describe(now)}")
    if not leases:
        print("  - no lease held (no collector is running, or engines write their own rows)")
    problems = _section(
        "KV events against the replica's own counts (its scraped counters, else its request rows):",
        [(c.verdict == "agree", f"{c.instance}: {c.verdict}: {c.words}") for c in checks],
        empty="nothing to check: no KV events and no counters in the range",
    )
    problems += _section(
        "Offload tiers (their counters against their KV events):", [(t.ok, f"{t.instance}: {t.words}") for t in tiers]
    )
    problems += _section(
        "Agent steps made of frameworks' spans, tied to their server requests (their KV story needs it):",
        [(j.ok, f"{j.source}: {j.words}") for j in joins],
    )
    if details is not None:
        problems += _section(
            "Agent replies (the SDK's steps): do they say what was cached?", [(details.ok, details.words)]
        )
    problems += _section(
        "Misses that are not the cache's (a bigger cache would not help):", [(False, start.words) for start in starts]
    )
    if args.collector:
        found = start_or_report("doctor", lambda: collector_checks(args.collector))
        if found is None:
            return 2
        title, rows = f"The collector ({args.collector}):", [(ok, f"{i}: {words}") for i, ok, words in found]
        problems += _section(title, rows, always=True)
    print(f"{problems} problem(s)" if problems else "every check passed")
    return 1 if problems else 0


def _section(title: str, rows: list[tuple[bool, str]], empty: str | None = None, always: bool = False) -> int:
    """Print a titled list of checks (`ok` or `!` before each), or `empty` as a problem where there is none (no
    title at all without either, unless `always`); the problems counted."""
    if not rows and empty is None and not always:
        return 0
    print(title)
    if not rows and empty is not None:
        print(f"  ! {empty}")
        return 1
    for ok, words in rows:
        print(f"  {'ok' if ok else '!'} {words}")
    return sum(not ok for ok, _ in rows)


def collector_checks(url: str) -> list[tuple[str, bool, str]]:
    """(replica, ok, words) from a collector's /metrics: the wire shapes it sent, its latest batch's lag, batches
    lost in sequence gaps, silences while it served, offload placeholders, rows dropped.

    Raises:
        OSError: the collector cannot be reached (or answers with an error).
    """
    import httpx

    try:
        response = httpx.get(url, timeout=10)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise OSError(f"cannot read the collector's metrics at {url}: {exc}") from exc
    return exposition_checks(response.text)


def exposition_checks(text: str) -> list[tuple[str, bool, str]]:
    """`collector_checks` of a collector's /metrics text: each replica's stream, then the collector's own."""
    from kvobs.analytics.cache import cached_fill_check, short_starts_check, ties_check

    exposed = _Exposition(text)
    replicas = _Replicas.read(exposed)
    out = [(instance, *replicas.check(instance)) for instance in replicas.named()]
    tied = exposed.by(kvobs_metrics.COLLECTOR_REQUESTS_TIED, LABEL_TIE)
    if any(tied.values()):  # blocks named no session: tied to their requests' sessions by inference
        out.append(("(KV blocks tied by inference)", *ties_check(tied)))
    short = exposed.by(kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_STARTS)
    begun = exposed.by(kvobs_metrics.COLLECTOR_KV_CHAIN_STARTS)
    shared = exposed.by(kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_TOKENS)
    stored = exposed.by(kvobs_metrics.COLLECTOR_KV_SHORT_SHARED_STORED_TOKENS)
    for instance in sorted(i for i, n in short.items() if n):  # a prefix shorter than a block: a miss with a name
        totals = (begun.get(instance, 0), short[instance], shared.get(instance, 0), stored.get(instance, 0))
        out.append((f"{instance} (shared prefix shorter than a block)", *short_starts_check(*totals)))
    filled = exposed.by(kvobs_metrics.COLLECTOR_REQUESTS_CACHED_FILLED, LABEL_OUTCOME)
    if any(filled.values()):  # requests whose spans say no cached tokens (vLLM's), given their replies' counts
        out.append(("(requests' cached tokens from replies)", *cached_fill_check(filled)))
    compiled = exposed.by(kvobs_metrics.COLLECTOR_KV_CORE_COMPILED).get(None)
    if compiled is not None:  # (a collector with KV-event streams)
        out.append(("(KV ingest core)", *_kv_core(float(compiled))))
    m = kvobs_metrics
    queue = _store_queue(
        exposed,
        [
            m.STORE_QUEUE_ROWS,
            m.STORE_QUEUE_PEAK_ROWS,
            m.STORE_QUEUE_CAPACITY_ROWS,
            m.STORE_DRAIN_LAG,
            m.STORE_DRAIN_LAG_PEAK,
            m.STORE_QUEUE_FULL,
        ],
    )
    if queue is not None:
        out.append(("(store queue)", *queue))
    workers = [m.WORKER_STORE_QUEUE_ROWS, m.WORKER_STORE_QUEUE_PEAK_ROWS, m.WORKER_STORE_QUEUE_CAPACITY_ROWS]
    workers += [m.WORKER_STORE_DRAIN_LAG, m.WORKER_STORE_DRAIN_LAG_PEAK, m.WORKER_STORE_QUEUE_FULL]
    for worker in sorted(w for w in exposed.by(m.WORKER_STORE_QUEUE_ROWS, LABEL_WORKER) if w is not None):
        queue = _store_queue(exposed, workers, worker)
        if queue is not None:  # (each stream worker's own writer: --workers on PostgreSQL, a ClickHouse server)
            out.append((f"(store queue of {worker})", *queue))
    dynamo = exposed.by(kvobs_metrics.COLLECTOR_DYNAMO_TRACE_ROWS, LABEL_OUTCOME)
    if any(dynamo.values()):  # (only with --dynamo-trace)
        out.append(("(Dynamo request-trace rows)", *_dynamo_rows(dynamo)))
    joins = exposed.by(kvobs_metrics.COLLECTOR_DYNAMO_TRACE_JOINS, LABEL_OUTCOME)
    if any(joins.values()):  # (with --dynamo-trace and --kv-events)
        out.append(("(Dynamo rows joined with KV events)", *_dynamo_joins(joins)))
    for component, n in sorted(exposed.by(kvobs_metrics.TELEMETRY_DROPPED, LABEL_COMPONENT).items()):
        if n:
            out.append(
                ("(collector)", False, f"{int(n):,} {component} item(s) dropped (kvobs_telemetry_dropped_total)")
            )
    return out


def _kv_core(compiled: float) -> tuple[bool, str]:
    """(ok, words) of the core attributing the KV events: the pure-Python fallback is the same rows at more CPU."""
    if compiled:
        return True, "compiled (C++)"
    return False, (
        "pure Python: the same rows at more CPU an event (the compiled core is not built where the collector runs, "
        "or KVOBS_KV_CORE=python); build it with python -m collectors.kv.core.build"
    )


def _store_queue(exposed: _Exposition, specs: list, worker: str | None = None) -> tuple[bool, str] | None:
    """(ok, words) of a store writer (the collector's, or `worker`'s own): rows held now and at most against its
    room, the oldest's wait now and at most; not ok once a unit found it full; None from a collector that says none
    of it. `specs`: its rows, peak rows, room, lag, peak lag and units full."""
    given = [exposed.by(spec, LABEL_WORKER).get(worker) for spec in specs]
    values = [float(v) for v in given if v is not None]
    if len(values) < len(given):
        return None
    rows, peak, room, lag, peak_lag, full = values
    words = (
        f"{int(rows):,} rows waiting to be committed (the oldest for {lag:.1f} s); at most {int(peak):,} (its queue "
        f"takes {int(room):,} besides the batch being written), the longest wait {peak_lag:.1f} s"
    )
    if full:
        words += (
            f"; {int(full):,} unit(s) found it full: each waited for room (a KV-event stream's socket buffering "
            "meanwhile), was refused (an OTLP export answered 429, sent again) or was dropped (counted as the store's "
            "dropped items): the store is slower than what comes in (a faster store, or --workers)"
        )
    return not full, words


def _dynamo_rows(outcomes: dict) -> tuple[bool, str]:
    """(ok, words) of the Dynamo request-trace rows the collector read from --dynamo-trace."""
    stored, left_out = int(outcomes.get("stored", 0)), int(outcomes.get("left_out", 0))
    words = f"{stored:,} stored, {left_out:,} left out"
    if left_out:
        words += " (the collector's log says why, once a reason: a row not of Dynamo's schema, a shard not gzip)"
    return not left_out, words


def _dynamo_joins(outcomes: dict) -> tuple[bool, str]:
    """(ok, words) of the Dynamo rows' joins with their workers' KV events (`TraceJoin`): ok when every row with
    blocks was joined."""
    joined = int(outcomes.get(TraceJoin.JOINED.value, 0))
    missed = {o: int(outcomes.get(o.value, 0)) for o in TraceJoin if o is not TraceJoin.JOINED}
    words = f"{joined:,} requests joined to the stream that held their blocks"
    said = [f"{n:,} {_JOIN_WORDS[o]}" for o, n in missed.items() if n]
    if said:
        words += "; " + "; ".join(said) + " (the collector's log says it once a reason; docs/coming-from.md)"
    return not said, words


_JOIN_WORDS = {
    TraceJoin.NOT_HELD: "whose blocks no KV stream held (is each worker's --kv-events collected?)",
    TraceJoin.AMBIGUOUS: "held alike by several streams, their worker never told apart: on no stream",
    TraceJoin.NO_BLOCKS: "naming no blocks (no replay.input_sequence_hashes)",
    TraceJoin.BLOCK_SIZE_DIFFERS: "of another block size than every stream's",
}


class _Exposition:
    """A /metrics text read once: its samples by family, summed by one label on demand."""

    def __init__(self, text: str) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        self.samples: dict[str, list] = {}
        for family in text_string_to_metric_families(text):
            self.samples.setdefault(family.name, []).extend(family.samples)

    def by(self, spec, label: str = LABEL_INSTANCE) -> dict:
        """The family's samples summed by `label` (a counter's `_created` left out)."""
        out: dict = {}
        for sample in self.samples.get(spec.name.removesuffix("_total"), []):
            if not sample.name.endswith("_created"):
                out[sample.labels.get(label)] = out.get(sample.labels.get(label), 0.0) + sample.value
        return out

    def counted(self, spec) -> list:
        """The counter's samples above zero."""
        return [s for s in self.samples.get(spec.name, []) if s.name.endswith("_total") and s.value]


@dataclass(frozen=True)
class _Replicas:
    """Each replica's stream as its collector counted it (instance -> value, per counter)."""

    shapes: dict[str, list[str]]
    lag: dict
    lost: dict
    silent: dict
    placeholders: dict
    unknown: dict[str, list[str]]  # "N blocks of TIER" of tiers kvobs does not know
    leases_lost: dict
    restarts: dict
    worker_up: dict
    unmeasured: dict
    apart: dict[str, int]  # requests compared with no replica: their block hashes never meet

    @classmethod
    def read(cls, exposed: _Exposition) -> _Replicas:
        m = kvobs_metrics
        shapes: dict[str, list[str]] = {}
        for sample in exposed.counted(m.COLLECTOR_KV_WIRE_BATCHES):
            shapes.setdefault(sample.labels[LABEL_INSTANCE], []).append(sample.labels[LABEL_SHAPE])
        unknown: dict[str, list[str]] = {}
        for sample in exposed.counted(m.COLLECTOR_KV_UNKNOWN_TIER_BLOCKS):
            said = f"{int(sample.value):,} blocks of {sample.labels[LABEL_MEDIUM]!r}"
            unknown.setdefault(sample.labels[LABEL_INSTANCE], []).append(said)
        apart: dict[str, int] = {}
        for sample in exposed.counted(m.COLLECTOR_ROUTING_UNCOMPARABLE):
            if sample.labels.get(LABEL_REASON) == PairApart.HASHES_DIFFER.value:
                apart[sample.labels[LABEL_INSTANCE]] = apart.get(sample.labels[LABEL_INSTANCE], 0) + int(sample.value)
        return cls(
            shapes=shapes,
            lag=exposed.by(m.COLLECTOR_KV_EVENT_LAG),
            lost=exposed.by(m.COLLECTOR_KV_EVENTS_LOST),
            silent=exposed.by(m.COLLECTOR_KV_STREAMS_SILENT),
            placeholders=exposed.by(m.COLLECTOR_KV_OFFLOAD_PLACEHOLDERS),
            unknown=unknown,
            leases_lost=exposed.by(m.COLLECTOR_LEASES_LOST),
            restarts=exposed.by(m.COLLECTOR_KV_WORKER_RESTARTS),
            worker_up=exposed.by(m.COLLECTOR_KV_WORKER_UP),
            unmeasured=exposed.by(m.COLLECTOR_ROUTING_UNMEASURED),
            apart=apart,
        )

    def named(self) -> list[str]:
        """The replicas any counter names (a zero counter of lost leases, restarts or unmeasured time names none)."""
        named = set(self.shapes) | set(self.lag) | set(self.lost) | set(self.silent) | set(self.apart)
        named |= set(self.unknown) | {i for i, n in self.leases_lost.items() if n}
        named |= {i for i, s in self.unmeasured.items() if s} | {i for i, n in self.restarts.items() if n}
        return sorted(named | {i for i, n in self.worker_up.items() if not n})

    def check(self, instance: str) -> tuple[bool, str]:
        """(ok, words) of one replica's stream: its wire shapes, then each fault counted, said with what to do."""
        words, ok = [f"wire: {' and '.join(sorted(self.shapes.get(instance, []))) or 'no batch yet'}"], True
        if instance in self.lag:
            late = self.lag[instance] > LAG_WARN_S
            ok &= not late
            words.append(
                f"latest batch {self.lag[instance]:.2f} s old on arrival" + (" (late: a clock or the path)" * late)
            )
        faults = self.faults(instance)
        words += faults
        if self.placeholders.get(instance):
            words.append(
                f"{int(self.placeholders[instance]):,} offload placeholders counted (not blocks of this cache)"
            )
        if self.unknown.get(instance):
            ok = False
            words.append(
                f"tiers kvobs does not know, not read: {', '.join(self.unknown[instance])} (kvobs reads GPU, CPU, "
                "DISK, STORAGE with locality LOCAL, REMOTE or none, SHARED_STORAGE and EXTERNAL under their engines' "
                "names; report the new one)"
            )
        return ok and not faults, "; ".join(words)

    def faults(self, instance: str) -> list[str]:
        """What went wrong with one replica's stream, each with what to do."""
        faults = []
        if self.lost.get(instance):
            faults.append(
                f"{int(self.lost[instance]):,} batches lost in sequence gaps (no replay endpoint, or too late)"
            )
        if self.silent.get(instance):
            faults.append(f"silent {int(self.silent[instance]):,} time(s) while the replica served (nobody binding?)")
        if self.leases_lost.get(instance):
            faults.append(
                f"its lease was taken by another writer {int(self.leases_lost[instance]):,} time(s): this collector "
                "dropped its data meanwhile (a stall past the lease, or two collectors given one replica)"
            )
        if self.worker_up.get(instance) == 0:
            faults.append(
                "its worker process is down and not yet started again: its stream is not read (the "
                "collector's log says why each start failed)"
            )
        if self.restarts.get(instance):
            faults.append(
                f"its worker process ended {int(self.restarts[instance]):,} time(s) unasked (killed, out of memory: "
                "the collector's log has each exit code); each time its stream resumed after the last batch taken, "
                "from the replay socket where configured, else the gap counts as lost batches"
            )
        if self.apart.get(instance):
            faults.append(
                f"{self.apart[instance]:,} request(s) compared with no other replica: its block hashes never meet "
                "theirs although sessions ran on both, so the routing loss leaves them out (the collector's log names "
                "the pair); give every replica the same PYTHONHASHSEED, or leave it unset on all with a sha256 "
                "--prefix-caching-hash-algo"
            )
        if self.unmeasured.get(instance):
            faults.append(
                f"{self.unmeasured[instance] / 3600:,.1f} h of its lookups were never measured: the collector before "
                "this one stopped more than six hours before it started, so the routing loss leaves that stretch out "
                "(keep a collector running, or restart it sooner)"
            )
        return faults
