"""`kvobs collect`: vLLM's (or our engine's) /metrics, KV events and OTLP traces into the kvobs store.

kvobs collect --vllm-url http://vllm:8000 --kv-events tcp://vllm:5557 --kv-events-replay tcp://vllm:5558 \\
              --otlp-grpc 0.0.0.0:4317 --otlp-http 0.0.0.0:4318 --forward-otlp http://jaeger:4318 \\
              --store postgresql://kvobs@postgres/kvobs
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from collectors.kv.silence import SILENCE_S as KV_SILENCE_S
from kvobs.addresses import host_port
from kvobs.commands.common import (
    add_hash_key_flag,
    add_retention_flag,
    add_session_end_flag,
    add_spool_flag,
    add_store_flag,
    lacks_extra,
    refuse_ports_in_use,
    start_or_report,
)
from kvobs.semconv.endpoints import STORE_URL_ENV
from kvobs.semconv.sessions import SESSION_IDLE_S

log = logging.getLogger(__name__)


def add_parser(sub) -> None:
    p = sub.add_parser("collect", help="collect vLLM /metrics, KV events and OTLP traces into the store")
    p.add_argument(
        "--vllm-url",
        action="append",
        default=[],
        metavar="[NAME=]URL",
        help="a vLLM (or kvobs serve) base URL to scrape; repeat for several; NAME defaults to host:port",
    )
    p.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="[NAME=]ENDPOINT",
        help="a vLLM's (or SGLang's) KV-event ZMQ endpoint: tcp://vllm:5557 (connect) or tcp://*:5557 (bind); or a "
        "TensorRT-LLM server, http://trtllm:8000, whose POST /kv_cache_events is called every 0.5 s; repeat for "
        "several replicas, each its own instance NAME (default: --instance, the only --vllm-url's name, or host:port)",
    )
    p.add_argument(
        "--kv-events-bind",
        action="store_true",
        help="bind ENDPOINT (vLLM was given a concrete address and connects to us)",
    )
    p.add_argument(
        "--kv-events-replay",
        action="append",
        default=[],
        metavar="[NAME=]ENDPOINT",
        help="vLLM's replay ROUTER endpoint, to fill gaps; NAME picks the stream, else the --kv-events at its position",
    )
    p.add_argument("--kv-events-topic", default="", help="topic prefix to subscribe to (vLLM's default: '')")
    p.add_argument(
        "--otlp-grpc", type=host_port, metavar="HOST:PORT", help="receive OTLP traces over gRPC, e.g. 0.0.0.0:4317"
    )
    p.add_argument(
        "--otlp-http", type=host_port, metavar="HOST:PORT", help="receive OTLP traces over HTTP, e.g. 0.0.0.0:4318"
    )
    p.add_argument(
        "--forward-otlp",
        metavar="URL",
        help="pass every received trace on unchanged: http://jaeger:4318 or grpc://jaeger:4317",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="where the collector's own KV spans go (default: --forward-otlp, else OTEL_EXPORTER_OTLP_*)",
    )
    add_store_flag(p)
    p.add_argument("--instance", help="instance name for KV events and spans (default: the only --vllm-url's name)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes and footprint snapshots")
    p.add_argument(
        "--settle",
        type=float,
        default=10.0,
        help="seconds an eviction waits for its session's request spans before it is classified idle/busy, and an "
        "agent's LLM call waits for its parent spans before it is made a step",
    )
    add_session_end_flag(p)
    p.add_argument(
        "--join-wait-s",
        type=float,
        metavar="S",
        help="how long an agent framework's LLM call waits for its server's request span before its step is written "
        "unjoined, and a request for its step before its stored blocks are tied to a session by inference (default "
        "20; a server exporting its spans late needs more)",
    )
    p.add_argument(
        "--session-idle-s",
        type=float,
        default=SESSION_IDLE_S,
        help="forget a session's state after this long without a KV event (nothing resident, nothing pending), so "
        "memory stays bounded; counted in kvobs_collector_sessions_forgotten_total",
    )
    p.add_argument(
        "--kv-silence-s",
        type=float,
        default=KV_SILENCE_S,
        metavar="S",
        help="warn (and count kvobs_collector_kv_streams_silent_total) when a KV stream delivers nothing this long "
        "while its replica's /metrics counts prefix-cache queries: both sides connecting, nobody binding",
    )
    add_retention_flag(p)
    add_spool_flag(p)
    add_hash_key_flag(p)
    p.add_argument(
        "--write-process",
        action="store_true",
        help="write the store (SQLite or PostgreSQL) from a child process, so the writes take no time from decoding "
        "and attributing KV events (bench/collector_ingest.py gives the rates each way)",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="decode and attribute the KV-event streams in N worker processes, each stream pinned to one (default: "
        "the machine's cores, up to the number of streams; 1, or a single stream: all in the collector's process)",
    )
    p.add_argument(
        "--dynamo-trace",
        metavar="DIR",
        help="follow NVIDIA Dynamo's request-trace shards in DIR (DYN_REQUEST_TRACE=1 on its frontend: rolling "
        ".jsonl.gz files, or the JSONL sink's file) as they are written: requests, sessions, steps and tool pauses",
    )
    p.add_argument(
        "--metrics-address", type=host_port, metavar="HOST:PORT", help="serve the collector's own /metrics here"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if lacks_extra("collect", "collectors", "collectors.collector"):
        return 2
    from collectors.collector import Collector, CollectorOptions

    def start() -> Collector:
        refuse_ports_in_use(_listeners(args), "another kvobs collect? stop it or pass other addresses")
        options = CollectorOptions(
            store_url=args.store or os.environ.get(STORE_URL_ENV),
            vllm_urls=args.vllm_url,
            kv_events=args.kv_events,
            kv_events_bind=args.kv_events_bind,
            kv_events_replay=args.kv_events_replay,
            kv_events_topic=args.kv_events_topic,
            session_idle_s=args.session_idle_s,
            kv_silence_s=args.kv_silence_s,
            retention_days=args.retention_days,
            spool_dir=args.spool_dir,
            write_process=args.write_process,
            workers=args.workers,
            dynamo_trace=args.dynamo_trace,
            hash_key_file=args.hash_key_file,
            otlp_grpc=args.otlp_grpc,
            otlp_http=args.otlp_http,
            forward_otlp=args.forward_otlp,
            otlp_endpoint=args.otlp_endpoint,
            instance=args.instance,
            interval_s=args.interval,
            settle_s=args.settle,
            session_end_after_s=args.session_end_after_s,
            **({} if args.join_wait_s is None else {"join_wait_s": args.join_wait_s}),
            metrics_address=args.metrics_address,
        )
        collector = Collector(options)
        collector.start()
        return collector

    # Before start: the OTLP receiver acknowledges exports as soon as it listens, so a SIGTERM from then on must
    # flush, not kill (Python's default). One that lands mid-start stops the collector once it has started.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    collector = start_or_report("collect", start)
    if collector is None:
        return 2
    stop.wait()
    log.info("stopping: flushing KV footprints, forwarded traces and store rows")
    collector.stop()
    return 0


def _listeners(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """Every (flag, host, port) the collector will listen on: checked before the store is opened, so a taken port
    costs a line naming its flag, not a store file and a bare `[Errno 98]`."""
    from urllib.parse import urlsplit

    from collectors.kv.streams import split_name
    from kvobs.addresses import split_host_port
    from kvobs.vllm import kv_events as wire

    listeners = [
        (flag, *split_host_port(value))
        for flag, value in (
            ("--otlp-http", args.otlp_http),
            ("--otlp-grpc", args.otlp_grpc),
            ("--metrics-address", args.metrics_address),
        )
        if value
    ]
    for value in args.kv_events:
        address = split_name(value)[1]
        endpoint = urlsplit(address.replace("//*:", "//0.0.0.0:"))  # (`*` is no host urllib reads a port after)
        binds = args.kv_events_bind or wire.should_bind(address)  # as the subscriber decides
        if endpoint.scheme == "tcp" and binds and endpoint.port:
            listeners.append(("--kv-events", endpoint.hostname or "0.0.0.0", endpoint.port))
    return listeners
