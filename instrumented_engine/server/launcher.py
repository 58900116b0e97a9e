"""Assemble and run the engine server: engine thread, metrics, KV-event publisher, HTTP.

server = EngineServer(EngineConfig(num_blocks=512), ServerOptions(port=8000))
server.run()                                 # blocks: what `kvobs serve` does

url = server.start_in_background()           # tests, `kvobs demo`: returns http://host:port
server.shutdown()                            # stops HTTP, the engine loop, then flushes the publisher
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.models.loader import ModelSource
from instrumented_engine.server.app import build_app
from instrumented_engine.server.kv_publisher import KVEventPublisher
from instrumented_engine.server.metrics import EngineMetrics
from instrumented_engine.server.serving import ServedModel

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60.0


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
    """

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_waiting: int = 256
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""

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
    """

    def __init__(
        self, config: EngineConfig, options: ServerOptions, *, source: ModelSource | None = None, progress: bool = True
    ) -> None:
        self.options = options
        llm_engine = LLMEngine(config, source=source, progress=progress)
        layout = llm_engine.layout
        self.served = ServedModel(options.served_model_name or llm_engine.model_name, layout.max_model_len,
                                  int(time.time()))  # fmt: skip
        self.metrics = EngineMetrics(
            self.served.name,
            cache_config={
                "block_size": str(layout.block_size),
                "num_gpu_blocks": str(layout.num_blocks),
                "enable_prefix_caching": str(config.enable_prefix_caching),
                "eviction_policy": config.eviction_policy,
                "cache_dtype": str(llm_engine.runner.dtype).removeprefix("torch."),
            },
            max_model_len=layout.max_model_len,
        )
        observers = [self.metrics]
        self.publisher = None
        if options.kv_events_endpoint:
            self.publisher = KVEventPublisher(
                options.kv_events_endpoint,
                replay_endpoint=options.kv_events_replay_endpoint,
                topic=options.kv_events_topic,
            )
            self.publisher.start()
            observers.append(self.publisher)
        self.engine = AsyncEngine(llm_engine, max_waiting=options.max_waiting, observers=observers)
        self.app = build_app(self.engine, self.served, self.metrics, lifespan=self._lifespan)
        self._uvicorn: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @asynccontextmanager
    async def _lifespan(self, _app):
        self.engine.start()
        yield
        await asyncio.to_thread(self._stop_engine)

    def _stop_engine(self) -> None:
        self.engine.stop()
        if self.publisher is not None:
            self.publisher.close()

    def _make_uvicorn(self) -> uvicorn.Server:
        config = uvicorn.Config(self.app, host=self.options.host, port=self.options.port, log_level="warning",
                                timeout_graceful_shutdown=5)  # fmt: skip
        return uvicorn.Server(config)

    @property
    def url(self) -> str:
        server = self._uvicorn
        if server is None or not server.started:
            raise RuntimeError("the server is not running")
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://{self.options.host}:{port}"

    def run(self) -> None:
        """Serve until interrupted (Ctrl-C / SIGTERM), then stop the engine and flush events.

        uvicorn re-raises the signal it caught once it has shut down; the handlers installed here
        receive it, so a graceful stop ends the process with status 0.
        """
        self._uvicorn = self._make_uvicorn()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda signum, _frame: log.debug("signal %d after shutdown", signum))
        asyncio.run(self._serve_and_announce())
        log.info("kvobs engine stopped")

    async def _serve_and_announce(self) -> None:
        task = asyncio.create_task(self._uvicorn.serve())
        while not self._uvicorn.started and not task.done():
            await asyncio.sleep(0.05)
        if self._uvicorn.started:
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
