"""`kvobs serve`: the engine behind an OpenAI-compatible API, vLLM's /metrics and KV-event stream.

kvobs serve --num-blocks 512 --max-model-len 2048 --port 8000 --kv-events-endpoint tcp://127.0.0.1:5557 \
            --otlp-endpoint http://localhost:4317 --store sqlite:///kvobs.db
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from instrumented_engine.commands.engine_flags import (
    add_engine_arguments,
    check_cache_fits,
    engine_config,
    parse_size,
)
from kvobs.addresses import port
from kvobs.commands.common import (
    add_hash_key_flag,
    add_retention_flag,
    add_spool_flag,
    add_store_flag,
    check_store,
    lacks_extra,
    refuse_ports_in_use,
    start_or_report,
)
from kvobs.semconv.endpoints import ENGINE_PORT, STORE_URL_ENV
from kvobs.semconv.limits import MAX_REQUEST_BYTES

log = logging.getLogger(__name__)

API_KEY_ENV = "KVOBS_API_KEY"


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the instrumented engine (OpenAI API, /metrics, KV events)")
    add_engine_arguments(p)
    p.add_argument("--host", default="127.0.0.1", help="address HTTP listens on (0.0.0.0: every interface)")
    p.add_argument("--port", type=port, default=ENGINE_PORT, help="HTTP port: the OpenAI API, /metrics, /health")
    p.add_argument("--served-model-name", help="the model name clients send (default: --model)")
    p.add_argument("--max-waiting", type=int, default=256, help="waiting requests before 429")
    p.add_argument(
        "--kv-events-endpoint",
        help="ZMQ endpoint for vLLM-format KV events: tcp://HOST:5557 connects to a collector that bound "
        "it; 'tcp://*:5557' binds every interface (the events carry prompt token ids)",
    )
    p.add_argument(
        "--kv-events-replay-endpoint", help="ZMQ ROUTER endpoint for replay (always bound), e.g. tcp://127.0.0.1:5558"
    )
    p.add_argument("--kv-events-topic", default="", help="topic frame of every KV-event message (vLLM: '')")
    p.add_argument(
        "--kv-events-omit-token-ids",
        action="store_true",
        help="publish KV events without the prompt's token ids (any subscriber can read them)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer token the admin endpoints need (default: ${API_KEY_ENV}; unset: open)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default=MAX_REQUEST_BYTES,
        help="largest request body, e.g. 16MiB (413 beyond it)",
    )
    p.add_argument(
        "--no-prompt-tokens-details",
        action="store_true",
        help="answer as vLLM does without --enable-prompt-tokens-details (its default): no cached tokens in usage",
    )
    p.add_argument(
        "--otlp-endpoint",
        help="OTLP endpoint for spans and metrics, e.g. http://localhost:4317 "
        "(default: OTEL_EXPORTER_OTLP_ENDPOINT; neither: no tracing)",
    )
    p.add_argument(
        "--otlp-protocol",
        choices=["grpc", "http/protobuf"],
        help="OTLP transport (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    p.add_argument(
        "--trace-sample-ratio",
        type=float,
        help="fraction of new traces kept, 0..1 (default: OTEL_TRACES_SAMPLER, else all)",
    )
    p.add_argument("--trace-steps-every", type=int, default=0, help="a kvcache.step span every N engine steps")
    add_store_flag(p, what="requests, KV events and snapshots", optional=True)
    add_retention_flag(p)
    add_spool_flag(p)
    add_hash_key_flag(p)
    p.add_argument("--instance", help="this engine's name in the store (default host:port)")
    p.add_argument("--snapshot-interval", type=float, default=5.0, help="seconds between instance snapshots")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    hint = "another kvobs serve or vLLM? stop it or pass another --port"

    def ports_free() -> bool:
        refuse_ports_in_use(listeners(args), hint)
        return True

    def cache_fits() -> bool:
        check_cache_fits(args)
        return True

    if start_or_report("serve", ports_free) is None:
        return 2  # before torch is imported, the model loaded or a store file made
    if lacks_extra("serve", "server", "instrumented_engine.server.launcher"):
        return 2
    if start_or_report("serve", cache_fits) is None:
        return 2  # before the weights load (seconds) or a store file is made
    store_url = args.store or os.environ.get(STORE_URL_ENV)
    if store_url and start_or_report("serve", lambda: _store_opens(store_url)) is None:
        return 2  # before torch is imported and the weights load
    from instrumented_engine.server.launcher import EngineServer, ServerOptions

    def start() -> EngineServer:
        options = ServerOptions(
            host=args.host,
            port=args.port,
            served_model_name=args.served_model_name or args.model,
            max_waiting=args.max_waiting,
            kv_events_endpoint=args.kv_events_endpoint,
            kv_events_replay_endpoint=args.kv_events_replay_endpoint,
            kv_events_topic=args.kv_events_topic,
            otlp_endpoint=args.otlp_endpoint,
            otlp_protocol=args.otlp_protocol,
            trace_sample_ratio=args.trace_sample_ratio,
            trace_steps_every=args.trace_steps_every,
            store_url=store_url,
            instance=args.instance,
            snapshot_interval_s=args.snapshot_interval,
            retention_days=args.retention_days,
            spool_dir=args.spool_dir,
            hash_key_file=args.hash_key_file,
            kv_events_omit_token_ids=args.kv_events_omit_token_ids,
            api_key=args.api_key or None,
            max_request_bytes=args.max_request_bytes,
            prompt_tokens_details=not args.no_prompt_tokens_details,
        )
        return EngineServer(engine_config(args), options)

    server = start_or_report("serve", start)
    if server is None:
        return 2
    try:
        server.run()
    except OSError as exc:  # the port was taken while the model loaded
        print(f"kvobs serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _store_opens(url: str) -> bool:
    check_store(url)
    return True


def listeners(args: argparse.Namespace) -> list[tuple[str, str, int]]:
    """(flag, host, port) of every socket `kvobs serve` will listen on: HTTP, and the KV-event endpoints it binds
    (a wildcard publisher endpoint; the replay endpoint always)."""
    from kvobs.vllm.kv_events import should_bind

    found = [("--port", args.host, args.port)]
    bound = [("--kv-events-replay-endpoint", args.kv_events_replay_endpoint)]
    if args.kv_events_endpoint and should_bind(args.kv_events_endpoint):
        bound.append(("--kv-events-endpoint", args.kv_events_endpoint))
    for flag, endpoint in bound:
        if endpoint and endpoint.startswith("tcp://"):
            host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            if port.isdigit():
                found.append((flag, "0.0.0.0" if host in ("*", "[::]", "::") else host.strip("[]"), int(port)))
    return found
