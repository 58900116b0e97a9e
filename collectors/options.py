"""What `kvobs collect` was asked to do, checked before anything is opened (`CollectorOptions`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from collectors.kv.silence import SILENCE_S
from collectors.kv.streams import parse_streams
from collectors.metrics.scraper import ScrapeTarget
from collectors.traces.otlp_forward import check_forward_url
from collectors.traces.span_steps import JOIN_WAIT_S
from kvobs.semconv.sessions import SESSION_END_AFTER_S, SESSION_IDLE_S


@dataclass
class CollectorOptions:
    """What `kvobs collect` was asked to do (its flags, one for one)."""

    store_url: str | None = None
    vllm_urls: list[str] = field(default_factory=list)
    kv_events: list[str] = field(default_factory=list)  # [NAME=]ENDPOINT per stream
    kv_events_bind: bool = False
    kv_events_replay: list[str] = field(default_factory=list)  # [NAME=]ENDPOINT
    kv_events_topic: str = ""
    otlp_grpc: str | None = None
    otlp_http: str | None = None
    forward_otlp: str | None = None
    otlp_endpoint: str | None = None  # where the bridge's spans go (default: the --forward-otlp target)
    instance: str | None = None
    interval_s: float = 5.0
    settle_s: float = 10.0
    session_end_after_s: float = SESSION_END_AFTER_S  # a session with no request this long (stream time) ended
    join_wait_s: float = (
        JOIN_WAIT_S  # a framework's call waits this long for its request span (and a request for its step)
    )
    metrics_address: str | None = None  # host:port of the collector's own /metrics
    session_idle_s: float = SESSION_IDLE_S  # forget a session's footprint state after this long without an event
    retention_days: float | None = None  # drop the store's raw KV events older than this
    spool_dir: str | None = None  # keep the writer's queue on disk here (kvobs.store.spool)
    write_process: bool = False  # write the store from a child process (kvobs.store.sql.write_process; SQL stores)
    kv_silence_s: float = SILENCE_S  # a KV stream silent this long while its replica serves is told (kv_silence)
    workers: int | None = None  # KV-event worker processes (collectors.kv.workers); None: the cores, up to the streams
    dynamo_trace: str | None = None  # a directory of Dynamo's request-trace shards, followed (collectors.dynamo_follow)
    hash_key_file: str | None = None  # a secret: block hashes stored keyed (kvobs.hash_key); None: KVOBS_HASH_KEY_FILE

    def __post_init__(self) -> None:
        if not (self.vllm_urls or self.kv_events or self.otlp_grpc or self.otlp_http or self.dynamo_trace):
            raise ValueError(
                "nothing to collect: give --vllm-url, --kv-events, --otlp-grpc, --otlp-http or --dynamo-trace"
            )
        if self.interval_s <= 0:
            raise ValueError(f"--interval must be positive; got {self.interval_s}")
        if self.session_idle_s <= 0:
            raise ValueError(f"--session-idle-s must be positive; got {self.session_idle_s}")
        if self.kv_silence_s <= 0:
            raise ValueError(f"--kv-silence-s must be positive; got {self.kv_silence_s}")
        if self.session_end_after_s <= 0:
            raise ValueError(f"--session-end-after-s must be positive; got {self.session_end_after_s}")
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers must be 1 or more; got {self.workers}")
        if self.join_wait_s < 0:
            raise ValueError(f"--join-wait-s must not be negative; got {self.join_wait_s}")
        for url in (self.forward_otlp, self.otlp_endpoint):
            if url is not None:
                check_forward_url(url)
        for url in self.vllm_urls:
            ScrapeTarget.parse(url)
        parse_streams(self.kv_events, self.kv_events_replay)
