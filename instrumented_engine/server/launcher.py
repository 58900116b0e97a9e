"""Assemble and run the engine server: engine thread, metrics, KV-event publisher, tracing, store, HTTP.

server = EngineServer(EngineConfig(num_blocks=512), ServerOptions(port=8000))
server.run()                                 # blocks: what `kvobs serve` does

url = server.start_in_background()           # tests, `kvobs demo`: returns http://host:port
server.shutdown()                            # stops HTTP and the engine loop, then flushes events, spans, rows

Observers of every engine step: `EngineMetrics` (/metrics, and OTel metrics when telemetry is on),
`KVEventPublisher` (with --kv-events-endpoint), `EngineTracer` (when an OTLP endpoint is configured by flag or
`OTEL_EXPORTER_OTLP_ENDPOINT`), `StoreRecorder` (with --store).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.async_engine import AsyncEngine, StepObserver
from instrumented_engine.engine.helper_thread import on_helper_thread
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.models.loader import ModelSource
from instrumented_engine.observers.kv_publisher import KVEventPublisher
from instrumented_engine.observers.metrics import EngineMetrics
from instrumented_engine.observers.otel_metrics import OTelMetricSink
from instrumented_engine.observers.spans import EngineTracer
from instrumented_engine.observers.store import StoreRecorder
from instrumented_engine.server.app import build_app
from instrumented_engine.server.guards import DEFAULT_MAX_REQUEST_BYTES
from instrumented_engine.server.serving import ServedModel
from kvobs.hash_key import HashKey
from kvobs.semconv.metrics import kvobs_metrics
from kvobs.store import StoreWriter, open_store
from kvobs.store.leases import RENEW_EVERY_S, LeaseKeeper
from kvobs.store.retention import EXPIRED_TABLE, Retention
from kvobs.store.spool import Spool
from kvobs.telemetry import Telemetry, TelemetryConfig, setup_telemetry

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0
GRACEFUL_SHUTDOWN_S = 5  # requests in flight at SIGTERM get this long to finish
ABORT_BEFORE_S = 1.0  # ... less this much, after which they are aborted and answered


@dataclass(frozen=True)
class ServerOptions:
    """How the server is reached and what it publishes.

    Args:
        host, port: where HTTP listens (port 0 picks a free one).
        served_model_name: the `model` clients send; defaults to the model's own name.
        max_waiting: requests allowed to wait for admission before 429.
        kv_events_endpoint: ZMQ endpoint for vLLM-format KV events (None: off). Binds for "tcp://*:N".
        kv_events_replay_endpoint: ROUTER endpoint answering replay requests.
        kv_events_topic: first frame of every KV-event message.
        otlp_endpoint: OTLP endpoint for spans and metrics (None: the `OTEL_EXPORTER_OTLP_*` variables decide).
        otlp_protocol: `grpc` or `http/protobuf` (None: `OTEL_EXPORTER_OTLP_PROTOCOL`, default grpc).
        trace_sample_ratio: fraction of new traces kept (None: `OTEL_TRACES_SAMPLER`, default keep all).
        trace_steps_every: a `kvcache.step` span every this many engine steps (0: none).
        store_url: write requests, KV events and snapshots to this store (None: no store).
        instance: this engine's name in the store (default host:port).
        snapshot_interval_s: seconds between instance snapshots in the store.
        retention_days: drop the store's raw KV events older than this (None: keep everything).
        spool_dir: keep the store writer's queue on disk here (None: in memory).
        hash_key_file: store block hashes keyed with the secret in this file (`kvobs.hash_key`).
        kv_events_omit_token_ids: publish KV events without the prompt's token ids (hashes only).
        api_key: the bearer token the admin endpoints need (None: open, as on loopback).
        max_request_bytes: largest request body (413 beyond it).
        prompt_tokens_details: put `usage.prompt_tokens_details` (the cached tokens) in replies; False answers as
            vLLM does by default (without --enable-prompt-tokens-details).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_waiting: int = 256
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None
    trace_sample_ratio: float | None = None
    trace_steps_every: int = 0
    store_url: str | None = None
    instance: str | None = None
    snapshot_interval_s: float = 5.0
    retention_days: float | None = None
    spool_dir: str | None = None
    hash_key_file: str | None = None  # block hashes stored keyed with this secret (None: KVOBS_HASH_KEY_FILE's)
    kv_events_omit_token_ids: bool = False
    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    prompt_tokens_details: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535; got {self.port}")
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1; got {self.max_waiting}")
        if self.kv_events_replay_endpoint and not self.kv_events_endpoint:
            raise ValueError("a KV-event replay endpoint needs --kv-events-endpoint too")


class EngineServer:
    """The engine behind HTTP, built once.

    Args:
        config: the engine's configuration.
        options: HTTP and KV-event options.
        source: an already opened model (shared weights in tests) instead of `config.model`.
        progress: show a progress bar while the weights load.
        telemetry: providers to use instead of building them from `options` (in-process exporters in tests).

    Raises:
        ValueError: bad options, a store URL with an unknown scheme.
        sqlalchemy.exc.OperationalError: the store cannot be reached at start.
    """

    def __init__(
        self,
        config: EngineConfig,
        options: ServerOptions,
        *,
        source: ModelSource | None = None,
        progress: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.options = options
        self.instance = options.instance or _default_instance(options)
        self.store = open_store(options.store_url) if options.store_url else None  # fail fast on a bad URL
        self.hash_key = HashKey.from_env(options.hash_key_file) if self.store is not None else None
        if self.hash_key is not None:
            log.info("block hashes are stored keyed: HMAC-SHA256, key fingerprint %s", self.hash_key.fingerprint)
        self.leases = None
        if self.store is not None:  # before the model loads: a held instance costs a line, not minutes
            self.leases = LeaseKeeper(self.store.leases, [self.instance], role="serve")
            self.leases.claim()
        self._stop_renewing = threading.Event()
        self.telemetry = telemetry or setup_telemetry(
            TelemetryConfig(
                service_name="kvobs-engine",
                service_instance_id=options.instance,  # a fleet of engines told apart by one collector
                endpoint=options.otlp_endpoint,
                protocol=options.otlp_protocol,
                sample_ratio=options.trace_sample_ratio,
            )
        )
        # off the main thread: the HTTP side must never start an OpenMP team of its own (see helper_thread)
        llm_engine = on_helper_thread(lambda: LLMEngine(config, source=source, progress=progress), name="kvobs-load")
        layout = llm_engine.layout
        self.started_at = time.time()  # this run's start: the cache is empty (`runs`, kvobs_engine_start_time)
        self.served = ServedModel(
            options.served_model_name or llm_engine.model_name,
            layout.max_model_len,
            int(self.started_at),
            token_details=options.prompt_tokens_details,
        )
        self.metrics = EngineMetrics(
            self.served.name,
            cache_config={
                "block_size": str(layout.block_size),
                "num_gpu_blocks": str(layout.num_blocks),
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "eviction_policy": config.eviction_policy,
                "cache_dtype": str(llm_engine.runner.dtype).removeprefix("torch."),
                "num_cpu_blocks": str(layout.num_offload_blocks or None),  # vLLM's CacheConfig fields
                "kv_offloading_size": str(config.kv_offloading_size / 2**30 if config.kv_offloading_size else None),
            },
            max_model_len=layout.max_model_len,
            offload=bool(layout.num_offload_blocks),
            extra_sinks=[OTelMetricSink(m)] if (m := self.telemetry.meter("kvobs.engine")) else [],
            started_at=self.started_at,
        )
        observers: list[StepObserver] = [self.metrics]
        self.publisher: KVEventPublisher | None = None
        if options.kv_events_endpoint:
            publisher = self.publisher = KVEventPublisher(
                options.kv_events_endpoint,
                replay_endpoint=options.kv_events_replay_endpoint,
                topic=options.kv_events_topic,
                omit_token_ids=options.kv_events_omit_token_ids,
            )
            publisher.start()
            observers.append(publisher)
            self.metrics.watch_dropped("kv_events", lambda: publisher.num_dropped)
        medium = llm_engine.block_manager.medium  # one decision: the wire's, the spans' and the store's medium
        self.tracer = None
        if self.telemetry.tracer_provider is not None:
            self.tracer = EngineTracer(
                self.telemetry.tracer_provider,
                model_name=self.served.name,
                block_size=layout.block_size,
                medium=medium,
                step_sample_every=options.trace_steps_every,
            )
            observers.append(self.tracer)
            self.metrics.watch_dropped("otlp", lambda: self.telemetry.num_export_failures)
        self.writer: StoreWriter | None = None
        self.recorder: StoreRecorder | None = None
        if self.store is not None:
            writer = self.writer = StoreWriter(
                self.store, spool=Spool(options.spool_dir) if options.spool_dir else None
            )
            self.recorder = StoreRecorder(
                writer,
                instance=self.instance,
                block_size=layout.block_size,
                medium=medium,
                snapshot_interval_s=options.snapshot_interval_s,
                hash_key=self.hash_key,
            )
            observers.append(self.recorder)
            self.recorder.record_run(
                self.started_at,
                self.served.name,
                llm_engine.current_stats(),
                config,
                offload_blocks=layout.num_offload_blocks,
            )
            self.metrics.watch_dropped("store", lambda: writer.num_dropped)
        tier = llm_engine.block_manager.tier
        if tier is not None:  # (vLLM counts no refused store: kvobs' own counter, only where there is a tier)
            self.metrics.watch_total(kvobs_metrics.KV_OFFLOAD_STORE_FAILURES, lambda: tier.num_store_failures)
        self.retention: Retention | None = None
        if self.store is not None and options.retention_days is not None:
            retention = self.retention = Retention(self.store, options.retention_days)
            self.metrics.watch_total(
                kvobs_metrics.STORE_ROWS_EXPIRED, lambda: retention.num_expired, table=EXPIRED_TABLE
            )
        self.engine = AsyncEngine(llm_engine, max_waiting=options.max_waiting, observers=observers)
        self.app = build_app(
            self.engine,
            self.served,
            self.metrics,
            lifespan=self._lifespan,
            api_key=options.api_key,
            max_request_bytes=options.max_request_bytes,
        )
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @asynccontextmanager
    async def _lifespan(self, _app):
        self.engine.start()
        if self.retention is not None:
            self.retention.start()
        if self.leases is not None:
            threading.Thread(target=self._renew_leases, name="kvobs-leases", daemon=True).start()
        yield
        await asyncio.to_thread(self._stop_engine)

    def _stop_engine(self) -> None:
        """Stop the loop, then flush every output: KV events, store rows, spans and metrics."""
        self.engine.stop()
        if self.retention is not None:
            self.retention.stop()
        if self.publisher is not None:
            self.publisher.close()
        self._stop_renewing.set()
        if self.writer is not None and self.recorder is not None:
            self.recorder.instance_snapshot(self.engine.engine.current_stats())
            self.writer.close()
            log.info("store: %d rows written, %d dropped", self.writer.num_written, self.writer.num_dropped)
        if self.store is not None:
            self._release_leases()
            self.store.close()
        self.telemetry.shutdown()

    def _renew_leases(self) -> None:
        """Keep this engine's lease on its instance (kvobs.store.leases) while it serves. A lease another writer took
        meanwhile (this engine stalled past it) is logged by the keeper; the engine goes on writing its own rows, and
        says so here, since its requests are still served."""
        if self.leases is None:
            return
        while not self._stop_renewing.wait(RENEW_EVERY_S):
            try:
                self.leases.renew(time.time())
            except Exception:
                log.exception("renewing the store lease on %s failed", self.instance)
                continue
            if self.leases.lost:
                log.error(
                    "%s: another writer holds this engine's instance; this engine still writes its rows under it, "
                    "so the store holds two writers' events for it until one stops",
                    self.instance,
                )

    def _release_leases(self) -> None:
        if self.leases is None:
            return
        try:
            self.leases.release()
        except Exception:
            log.exception("releasing the store lease on %s failed: it expires by itself", self.instance)

    def _make_uvicorn(self) -> uvicorn.Server:
        config = uvicorn.Config(
            self.app,
            host=self.options.host,
            port=self.options.port,
            log_level="warning",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
        return _DrainingServer(config, self.engine)

    @property
    def url(self) -> str:
        server = self._uvicorn
        if server is None or not server.started:
            raise RuntimeError("the server is not running")
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.options.host}:{port}"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C / SIGTERM), then stop the engine and flush events. uvicorn re-raises the
        signal it caught once it has shut down; the handlers installed here receive it, so a graceful stop ends the
        process with status 0. Raises `OSError` when HTTP cannot listen (the engine stopped, the store flushed)."""
        server = self._uvicorn = self._make_uvicorn()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: log.debug("signal %d after shutdown", signum))
        try:
            asyncio.run(self._serve_and_announce())
        except SystemExit:  # uvicorn exits when it cannot listen, after stopping the engine (the store flushed)
            if server.started:
                raise
            where = f"{self.options.host}:{self.options.port}"
            raise OSError(f"cannot listen on {where} (uvicorn's reason above)") from None
        log.info("kvobs engine stopped")

    async def _serve_and_announce(self) -> None:
        server = self._uvicorn
        if server is None:
            raise RuntimeError("_serve_and_announce before run")
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            log.info("kvobs engine serving %r at %s (OpenAI API under /v1)", self.served.name, self.url)
        await task

    def start_in_background(self) -> str:
        """Serve from a thread; returns the base URL once the server accepts connections."""
        self._uvicorn = self._make_uvicorn()
        self._thread = threading.Thread(target=self._uvicorn.run, name="kvobs-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.options.host}:{self.options.port}")
            time.sleep(0.02)
        return self.url

    def shutdown(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(30)


class _DrainingServer(uvicorn.Server):
    """uvicorn, with one step added to its graceful shutdown: requests still running shortly before the grace period
    ends are aborted in the engine, so each client gets an answer (503, or an error event on a stream) and the store
    an `abort` row, instead of uvicorn cancelling the task (a bare 500 and no row)."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine) -> None:
        super().__init__(config)
        self.engine = engine

    async def shutdown(self, sockets=None) -> None:
        grace = self.config.timeout_graceful_shutdown or 0
        timer = asyncio.get_running_loop().call_later(max(0.0, grace - ABORT_BEFORE_S), self.engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()


def _default_instance(options: ServerOptions) -> str:
    host = socket.gethostname() if options.host in ("0.0.0.0", "::", "") else options.host
    return f"{host}:{options.port}"
