"""`kvobs collect`: one process that scrapes, subscribes and receives into one store.

    collector = Collector(CollectorOptions(store_url="sqlite:///kvobs.db", vllm_urls=["http://vllm:8000"],
                                           kv_events="tcp://vllm:5557", otlp_http="0.0.0.0:4318"))
    collector.start()
    ...
    collector.stop()       # stops receiving, classifies what is pending, flushes forwarder, store and spans

Instances: a `--vllm-url` is named `NAME=URL` or by its host:port. KV events and spans carry no instance of
their own, so they take `instance` when given, else the name of the only `--vllm-url`, else (KV events) the
endpoint's host:port and (spans) the exporter's `service.name`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry, start_http_server

from collectors.block_owners import HOLD_AFTER_JOIN_S, RECENT_S, BlockOwners
from collectors.drops import DropCounter
from collectors.dynamo_follow import DynamoTraceFollower
from collectors.dynamo_join import DynamoJoin
from collectors.dynamo_trace import DEFAULT_INSTANCE
from collectors.jobs.routing_meter import ROUTING_INTERVAL_S, RoutingMeter
from collectors.jobs.step_verdicts import VerdictKeeper
from collectors.kv.bridge import KVSpanBridge
from collectors.kv.core import load as load_core
from collectors.kv.core import say as say_core
from collectors.kv.ingest import STORE_WAIT_S, KVIngest
from collectors.kv.poller import KVEventPoller
from collectors.kv.rebuild import rebuild_clocks
from collectors.kv.silence import KVSilenceWatch
from collectors.kv.streams import KVStreamSpec, parse_streams, subscribe
from collectors.kv.subscriber import KVEventSubscriber
from collectors.kv.workers import RemoteIngest, RemoteSubscriber, WorkerPool, answering, default_workers
from collectors.metrics.scraper import Scraper, ScrapeTarget
from collectors.options import CollectorOptions
from collectors.own_metrics import CollectorMetrics
from collectors.session_activity import SessionActivity
from collectors.traces.otlp_forward import OTLPForwarder
from collectors.traces.otlp_receiver import OTLPReceiver
from collectors.traces.span_ingest import SpanIngest
from collectors.traces.span_steps import SpanSteps
from kvobs.addresses import split_host_port
from kvobs.analytics.steps import VERDICT_INTERVAL_S
from kvobs.hash_key import HashKey, key_file
from kvobs.store import Store, open_store
from kvobs.store.db import takes_many_writers
from kvobs.store.leases import LeaseKeeper
from kvobs.store.retention import Retention
from kvobs.store.spool import Spool
from kvobs.store.sql.write_process import WriteProcess
from kvobs.store.writer import StoreWriter
from kvobs.telemetry import Telemetry, TelemetryConfig, setup_telemetry
from kvobs.vllm.kv_events import should_bind

log = logging.getLogger(__name__)

SERVICE_NAME = "kvobs-collector"
RESOLVE_CHUNK = 500
LOOKUP_CHUNK = 2_000  # request lookups queued for the writer as one unit
LOOKUP_WAIT_S = 5.0  # how long the meter waits for room in the writer's queue (its run is behind now anyway)


class Collector:
    def __init__(
        self,
        options: CollectorOptions,
        *,
        store: Store | None = None,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`clock`: the time its parts wait and settle by; None, the machine's (a capture's replay gives its own)."""
        self.options = options
        timed: dict[str, Any] = {} if clock is None else {"clock": clock}
        self._timed = timed
        self.targets = [ScrapeTarget.parse(u) for u in options.vllm_urls]
        default = options.instance or (self.targets[0].instance if len(self.targets) == 1 else None)
        self._owns_store = store is None
        self.store = store or open_store(options.store_url)
        self.writes = WriteProcess(self.store.url) if options.write_process else None  # the store opened (migrated)
        self.writer = StoreWriter(
            self.writes or self.store, spool=Spool(options.spool_dir) if options.spool_dir else None
        )
        self.drops = DropCounter()
        self.activity = SessionActivity(resolve=self._trace_sessions, end_after_s=options.session_end_after_s, **timed)
        self.telemetry = telemetry or self._telemetry()
        self.forwarder = OTLPForwarder(options.forward_otlp, self.drops) if options.forward_otlp else None
        tracer = self.telemetry.tracer("kvobs.collector")
        bridge = KVSpanBridge(tracer, self.activity) if tracer is not None else None
        self.bridge = bridge
        specs = parse_streams(options.kv_events, options.kv_events_replay, default_instance=default)
        self.hash_key = HashKey.from_env(options.hash_key_file)  # (a worker process reads the same file)
        self.kv_core = load_core()  # (a worker process loads the same build: the same environment)
        self.pool = self._pool(specs)
        self.streams = [self._stream(spec, bridge) if self.pool is None else self._remote(spec) for spec in specs]
        replicas = [t.instance for t in self.targets] + [s.spec.instance for s in self.streams]
        self.leases = LeaseKeeper(self.store.leases, replicas, role="collect")  # one writer per replica
        if self.pool is not None:  # (a worker drops a stream's batches from the moment its lease is lost)
            self.leases.on_change.append(self.pool.set_lease)
        self.span_steps = SpanSteps(
            self.writer,
            activity=self.activity,
            settle_s=options.settle_s,
            join_wait_s=options.join_wait_s,
            step_counts=lambda ids: self.store.lookups.session_step_counts(ids),
            **timed,
        )
        # the blocks of requests whose steps were joined, where the blocks name no session: only where both come
        self.block_owners = (
            BlockOwners(
                self.activity,
                [s.ingest for s in self.streams],
                join_wait_s=options.join_wait_s,
                hold_s=options.join_wait_s + HOLD_AFTER_JOIN_S,
                **timed,
            )
            if self.streams and (options.otlp_grpc or options.otlp_http)
            else None
        )
        self.span_ingest = SpanIngest(
            self.writer,
            activity=self.activity,
            steps=self.span_steps,
            owners=self.block_owners,
            instance=default,
            known_instances=replicas,
        )
        self.scraper = (
            Scraper(self.targets, self.writer, self.drops, interval_s=options.interval_s, held=self.leases.held)
            if self.targets
            else None
        )
        self.kv_silence = KVSilenceWatch(self.streams, self.scraper, silence_s=options.kv_silence_s)
        self.receiver = None
        if options.otlp_grpc or options.otlp_http:
            self.receiver = OTLPReceiver(self.export, grpc_address=options.otlp_grpc, http_address=options.otlp_http)
        self.retention = Retention(self.store, options.retention_days) if options.retention_days is not None else None
        # its replicas' routing loss against the fleet's (the store's) other replicas
        kv_instances = [stream.spec.instance for stream in self.streams]
        self.routing_meter = (
            RoutingMeter(self.store, kv_instances, write=self._write_lookups, progress=self.writer.upsert)
            if kv_instances
            else None
        )
        # failed steps' verdicts, once their session settled (ended, or as long without a step as a session ends)
        self.verdicts = VerdictKeeper(
            self.store, self._write_verdicts, progress=self.writer.upsert, end_after_s=options.session_end_after_s
        )
        self.dynamo = self._dynamo() if options.dynamo_trace else None
        self._last_runs: dict[str, float] = {}  # `_every`'s jobs: when each last ran
        self.registry = CollectorRegistry()
        self.registry.register(CollectorMetrics(self))
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="kvobs-collector-tick", daemon=True)
        self._metrics_server: Any = None  # prometheus_client's (WSGI server, thread), once started

    def _dynamo(self) -> DynamoTraceFollower:
        """Dynamo's request-trace shards followed; with KV streams, each row joined with its worker's blocks, whose
        removals are held a while as ownership by inference holds them (the row comes once its request ended)."""
        o, join = self.options, None
        if self.streams:
            join = DynamoJoin([stream.ingest for stream in self.streams])
            for stream in self.streams:
                if stream.ingest.recent is None:
                    stream.ingest.infer_owners(o.join_wait_s + HOLD_AFTER_JOIN_S, RECENT_S)
        directory = Path(cast(str, o.dynamo_trace))
        return DynamoTraceFollower(self.writer, directory, instance=o.instance or DEFAULT_INSTANCE, join=join)

    def _telemetry(self) -> Telemetry:
        """The bridge's spans go to --otlp-endpoint, else the --forward-otlp target, else OTEL_EXPORTER_OTLP_*."""
        endpoint, protocol = self.options.otlp_endpoint or self.options.forward_otlp, None
        if endpoint is not None:
            protocol = "grpc" if endpoint.startswith("grpc://") else "http/protobuf"
            endpoint = endpoint.replace("grpc://", "http://", 1).removesuffix("/v1/traces")
        return setup_telemetry(
            TelemetryConfig(service_name=SERVICE_NAME, endpoint=endpoint, protocol=protocol, metrics=False)
        )

    def _pool(self, specs: list[KVStreamSpec]) -> WorkerPool | None:
        """The worker processes the streams are pinned to; None: one (the streams stay in this process)."""
        o = self.options
        workers = default_workers(len(specs)) if o.workers is None else o.workers
        if workers < 2 or len(specs) < 2:
            return None
        options = {
            "settle_s": o.settle_s,
            "session_idle_s": o.session_idle_s,
            "verdict_wait_s": o.settle_s + o.join_wait_s,
            "bind": True if o.kv_events_bind else None,
            "topic": o.kv_events_topic,
            "hash_key_file": key_file(o.hash_key_file),
        }
        config = {
            "options": options,
            "infer": None,
            "bridge": self.bridge is not None,
            "leases": {},
            "sequences": bool(o.dynamo_trace),  # each stream names its blocks as Dynamo does (`DynamoJoin`)
            "log_level": logging.getLogger().getEffectiveLevel(),
            # a store many processes write: each worker writes its streams' rows itself (its own spool beside ours)
            "direct": {"url": self.store.url, "spool_dir": o.spool_dir} if takes_many_writers(self.store.url) else None,
        }
        handler = answering(
            self.writer, lookups=self.store.lookups, activity=self.activity, bridge=self.bridge, wait_s=STORE_WAIT_S
        )
        return WorkerPool(specs, workers, config=config, handler=handler, before_restart=lambda: self.writer.flush())

    def _remote(self, spec: KVStreamSpec) -> KVStream:
        assert self.pool is not None
        worker = self.pool.of(spec.instance)
        ingest = RemoteIngest(worker, spec.instance, lambda instance: self.leases.held(instance))
        subscriber = RemoteSubscriber(
            worker, spec, bind=bool(self.options.kv_events_bind) or should_bind(spec.endpoint)
        )
        return KVStream(spec, ingest, subscriber)

    def _stream(self, spec: KVStreamSpec, bridge) -> KVStream:
        o = self.options
        ingest = KVIngest(
            self.writer,
            instance=spec.instance,
            activity=self.activity,
            bridge=bridge,
            settle_s=o.settle_s,
            session_idle_s=o.session_idle_s,
            verdict_wait_s=o.settle_s + o.join_wait_s,  # (a step joins its request up to the join wait later)
            session_ends=lambda ids: self.store.lookups.session_ends(ids),
            core=self.kv_core,
            **self._timed,
        )
        if o.dynamo_trace:  # Dynamo's request-trace rows name their blocks as its router does (`DynamoJoin`)
            ingest.name_sequences()

        key = self.hash_key

        def on_batch(seq: int, batch) -> None:
            if self.leases.held(spec.instance):
                ingest.on_batch(seq, batch if key is None else key.batch(batch))
            else:
                self.drops.count("kv_events", "lease_lost", f"{spec.instance} is written by another collector")

        bind = True if o.kv_events_bind else None
        subscriber = subscribe(
            spec,
            on_batch,
            self.drops,
            on_restart=ingest.on_restart,
            bind=bind,
            topic=o.kv_events_topic,
            token_hashes=bool(o.dynamo_trace),
        )
        return KVStream(spec, ingest, subscriber)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Claim this collector's replicas, then bind and connect everything; raises LeaseRefused when another
        collector holds a replica, OSError when an address is taken or unusable."""
        self.leases.claim()
        if self.streams:
            say_core(self.kv_core)
        if self.hash_key is not None:
            log.info("block hashes are stored keyed: HMAC-SHA256, key fingerprint %s", self.hash_key.fingerprint)
        for stream in self.streams:  # a restart goes on with the lifetimes and restores of the rows before it
            if isinstance(stream.ingest, KVIngest):  # (a worker rebuilds its own streams' as it starts)
                rebuild_clocks(stream.ingest, self.store.lookups)
        if self.forwarder is not None:
            self.forwarder.start()
        if self.pool is not None:
            self.pool.start()
        for stream in self.streams:
            stream.subscriber.start()
        if self.receiver is not None:
            self.receiver.start()
        if self.scraper is not None:
            self.scraper.start()
        if self.options.metrics_address:
            host, port = split_host_port(self.options.metrics_address)
            self._metrics_server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._ticker.start()
        if self.retention is not None:
            self.retention.start()
        log.info("collecting into %s: %s", self.store.url.split("@")[-1], self.describe())

    def describe(self) -> str:
        parts = [f"scrape {t.instance}={t.url}" for t in self.targets]
        for stream in self.streams:
            how = "bind" if stream.subscriber.bind else "connect"
            parts.append(f"KV events {stream.spec.instance}: {how} {stream.spec.endpoint}")
        if self.receiver is not None:
            listening = [
                f"{name} :{port}"
                for name, port in (("gRPC", self.receiver.grpc_port), ("HTTP", self.receiver.http_port))
                if port
            ]
            parts.append("OTLP " + ", ".join(listening))
        if self.forwarder is not None:
            parts.append(f"forward to {self.forwarder.url}")
        if self.dynamo is not None:
            parts.append(f"Dynamo request traces in {self.dynamo.directory}")
        return "; ".join(parts)

    def stop(self) -> None:
        """Stop receiving, then flush: pending classifications, forwarded exports, store rows, bridge spans."""
        self._stop.set()
        for part in (self.scraper, *(s.subscriber for s in self.streams), self.receiver):
            if part is not None:
                part.stop()
        if self._ticker.is_alive():  # (not started: a start refused, e.g. a replica held by another collector)
            self._ticker.join(self.options.interval_s + 5)
        if self.retention is not None:
            self.retention.stop()
        self.span_steps.settle(final=True)
        if self.dynamo is not None:  # what Dynamo wrote up to now, stored with the rest
            self._every(time.time(), 0.0, self.dynamo.poll, "reading Dynamo's request-trace shards")
        self._tie_blocks(final=True)
        # the steps' session ends committed first: the final verdicts read them from the store, so a loss after its
        # session's end is not left pending because the writer had not yet written that end
        self.writer.flush()
        for stream in self.streams:
            stream.ingest.snapshot(final=True)
        if self.pool is not None:
            self.pool.close()  # (every stream's last rows are in the writer's queue now)
        try:  # the last steps stored, the keeper decides what has settled and says it stopped
            self.writer.flush()
            self.verdicts.stop(time.time())
        except Exception:
            log.exception("deciding the failed steps of settled sessions at stop failed")
        if self.forwarder is not None:
            self.forwarder.close()
        self.writer.close()
        if self.writes is not None:
            self.writes.close()  # once its queue is written
        try:
            self.leases.release()  # after the last rows: a successor starts where this one's rows end
        except Exception:
            log.exception("releasing the leases failed: they expire by themselves")
        self.telemetry.shutdown()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if self._owns_store:
            self.store.close()

    # ---- internals ---------------------------------------------------------------------------------------
    def export(self, request) -> int:
        """One OTLP trace export (the receiver's, or one a capture recorded); returns the spans refused."""
        refused = self.span_ingest.handle(request)  # first: an export the store cannot take now (Busy) is not forwarded
        if self.forwarder is not None:
            self.forwarder.forward(request)
        return refused

    def _tick(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            self.tick(time.time())
            self.kv_silence.check()
            try:
                self.leases.renew(time.time())
            except Exception:
                log.exception("renewing the leases failed")

    def tick(self, now: float) -> None:
        """The jobs on what came in: steps made of spans, blocks tied, footprints written, and at their own intervals
        the routing loss and the failed steps' verdicts (`now`: the time they run at, a capture's own in a replay)."""
        try:
            self.span_steps.settle()
        except Exception:
            log.exception("making steps of agent spans failed")
        self._tie_blocks()
        for stream in self.streams:
            try:
                stream.ingest.snapshot()
            except Exception:
                log.exception("writing session footprints of %s failed", stream.spec.instance)
        if self.dynamo is not None:
            self._every(now, 0.0, self.dynamo.poll, "reading Dynamo's request-trace shards")
        if self.routing_meter is not None:
            self._every(now, ROUTING_INTERVAL_S, self.routing_meter.run, "measuring the fleet's routing loss")
        self._every(now, VERDICT_INTERVAL_S, self.verdicts.run, "deciding the failed steps of settled sessions")

    def _tie_blocks(self, *, final: bool = False) -> None:
        if self.block_owners is not None:
            try:
                self.block_owners.run(final=final)
            except Exception:
                log.exception("tying stored blocks to the sessions of their requests failed")

    def _every(self, now: float, interval_s: float, job, what: str) -> None:
        """Run `job(now)` when `interval_s` has passed since its last run (the tick is shorter); a failure logged."""
        if now - self._last_runs.get(what, float("-inf")) < interval_s:
            return
        self._last_runs[what] = now
        try:
            job(now)
        except Exception:
            log.exception("%s failed", what)

    def _write_lookups(self, records) -> None:
        for i in range(0, len(records), LOOKUP_CHUNK):  # a unit of the writer's queue each
            self.writer.add_many(records[i : i + LOOKUP_CHUNK], wait_s=LOOKUP_WAIT_S)

    def _write_verdicts(self, records) -> None:
        for record in records:
            self.writer.upsert(record)

    def _trace_sessions(self, trace_ids) -> dict[str, str]:
        """trace id -> session from the agent steps the SDK wrote to this store."""
        return self.store.lookups.trace_sessions(trace_ids, chunk=RESOLVE_CHUNK)

    def dropped_totals(self) -> dict[str, int]:
        totals = self.drops.totals()
        if self.receiver is not None:
            totals["otlp"] = totals.get("otlp", 0) + self.receiver.num_malformed + self.receiver.num_spans_refused
        if self.telemetry.num_export_failures:
            totals["otlp_export"] = self.telemetry.num_export_failures
        if self.pool is not None:
            for component, n in self.pool.drop_counts().items():
                totals[component] = totals.get(component, 0) + n
        totals["store"] = totals.get("store", 0) + self.writer.num_dropped  # (the workers' own writers' too)
        return totals

    def targets_up(self) -> dict[str, bool]:
        return dict(self.scraper.up) if self.scraper is not None else {}


@dataclass
class KVStream:
    """One `--kv-events` stream: its spec, its ingest (chains, footprints) and its subscriber (socket, sequence)."""

    spec: KVStreamSpec
    ingest: KVIngest | RemoteIngest  # (a worker's stream: read through proxies with the same names)
    subscriber: KVEventSubscriber | KVEventPoller | RemoteSubscriber
