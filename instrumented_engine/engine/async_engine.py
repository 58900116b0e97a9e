"""The engine in the background: one thread owns `LLMEngine`, asyncio code talks to it.

    engine = AsyncEngine(LLMEngine(config), max_waiting=256, observers=[metrics, publisher])
    engine.start()
    stream = await engine.add_request(prompt_ids, params, request_id="r1", session_id="s1")
    async for out in stream: ...                                         # RequestOutput per new token
    await engine.call(lambda e: e.invalidate("weights_update"))          # runs between two steps
    engine.abort(rid)                                                    # frees its blocks

Only the engine thread touches `LLMEngine`: requests, aborts and admin calls are commands it runs
between steps, so the block manager never sees two writers. After every step, and after commands
that changed the cache, each observer gets a `StepResult` (outputs, stats, drained KV events) on the
engine thread; an observer that raises is logged and never stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.stats import RequestOutput, StepResult
from instrumented_engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # how long the idle loop blocks on its command queue before checking for shutdown
BATCH_WINDOW_S = 0.005  # an idle engine woken by a request waits this long for others arriving with it


class QueueFullError(RuntimeError):
    """The waiting queue holds `max_waiting` requests already (HTTP 429)."""


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an error; no request can be served (HTTP 503)."""


class StepObserver(Protocol):
    def on_step(self, result: StepResult) -> None: ...


_END = object()  # closes a request's output stream


class RequestStream:
    """One request's outputs as an async iterator; leaving the loop early aborts the request."""

    def __init__(self, engine: AsyncEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = ""
        self.finished = False
        self._engine = engine
        self._loop = loop
        self._outputs: asyncio.Queue[RequestOutput | BaseException | object] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException | object) -> None:
        """Called from the engine thread."""
        self._loop.call_soon_threadsafe(self._outputs.put_nowait, item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while True:
                item = await self._outputs.get()
                if isinstance(item, BaseException):
                    raise item
                if not isinstance(item, RequestOutput):  # `_END`
                    return
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self.abort()

    def abort(self) -> None:
        if not self.finished:
            self._engine.abort(self.request_id)


class AsyncEngine:
    """Run `LLMEngine.step()` in a thread and hand each request's outputs to the asyncio side.

    Args:
        engine: the engine to own; nothing else may call it once `start()` ran.
        max_waiting: most requests waiting for admission; more are refused with `QueueFullError`.
        observers: called with every `StepResult` on the engine thread (metrics, event publishers).
        batch_window_s: when a request wakes an idle engine, how long it waits for more before its first step, so
            clients that arrive together are prefilled together (0: no wait).
    """

    def __init__(
        self,
        engine: LLMEngine,
        *,
        max_waiting: int = 256,
        observers: Sequence[StepObserver] = (),
        batch_window_s: float = BATCH_WINDOW_S,
    ) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1; got {max_waiting}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.observers = list(observers)
        self.batch_window_s = batch_window_s
        self.error: BaseException | None = None
        self.draining = False  # abort_all() was called: the server is shutting down
        self._commands: queue.SimpleQueue[tuple[Callable[[LLMEngine], Any], Future]] = queue.SimpleQueue()
        self._requests: dict[str, RequestStream] = {}  # engine thread only
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kvobs-engine", daemon=True)

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; requests still in flight end with `EngineDeadError`."""
        self._stopping.set()
        self._thread.join(timeout_s)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive() and self.error is None

    # ---- the asyncio side ---------------------------------------------------------------------
    async def call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        """Run `fn(engine)` on the engine thread between two steps and return its result."""
        if not self.is_alive:
            raise EngineDeadError(f"the engine loop is not running ({self.error!r})")
        future: Future = Future()
        self._commands.put((fn, future))
        return await asyncio.wrap_future(future)

    async def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        request_id: str,
        session_id: str | None = None,
        trace_headers: dict[str, str] | None = None,
        arrival_ts: float | None = None,
        parent_session_id: str | None = None,
    ) -> RequestStream:
        """Queue a request and return its output stream; `arrival_ts`: when it reached the server (None: when the
        engine thread takes it, between two steps).

        Raises:
            ValueError: the engine refused the prompt or its limits (HTTP 400).
            QueueFullError: `max_waiting` requests are already waiting (HTTP 429).
            EngineDeadError: the engine loop is not running (HTTP 503).
        """
        stream = RequestStream(self, asyncio.get_running_loop())

        def add(engine: LLMEngine) -> None:
            if len(engine.scheduler.waiting) >= self.max_waiting:
                raise QueueFullError(f"{self.max_waiting} requests are already waiting; retry later")
            stream.request_id = engine.add_request(
                prompt_token_ids,
                params,
                request_id=request_id,
                session_id=session_id,
                trace_headers=trace_headers,
                arrival_ts=arrival_ts,
                parent_session_id=parent_session_id,
            )
            self._requests[stream.request_id] = stream

        try:
            await self.call(add)
        except asyncio.CancelledError:  # the caller went away while the engine was adding it
            self.abort(request_id)
            raise
        return stream

    def abort(self, request_id: str) -> None:
        """Abort from any thread; a no-op when the request already finished."""
        if self.is_alive:
            self._commands.put((lambda engine: self._abort(engine, request_id), Future()))

    def abort_all(self) -> None:
        """Abort every request in flight (the server is shutting down): each ends with finish reason `abort`, so
        its client gets an answer and the store its `requests` row, instead of a cancelled task."""
        self.draining = True
        if self.is_alive:
            self._commands.put((self._abort_every, Future()))

    # ---- the engine thread --------------------------------------------------------------------
    def _abort_every(self, engine) -> None:
        for request_id in list(self._requests):
            self._abort(engine, request_id)

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                busy = self.engine.has_unfinished_requests()
                if busy:
                    self._run_commands()
                else:  # idle: wait for work, then for whatever arrives with it (clients sent together)
                    self._run_commands(first_wait_s=IDLE_WAIT_S, gather_s=self.batch_window_s)
                if self.engine.has_unfinished_requests():
                    self._publish(self.engine.step())
                elif not busy:
                    self._end_idle_sessions()
        except BaseException as exc:  # the loop must not die silently: fail every request
            log.exception("the engine loop stopped")
            self.error = exc
        finally:
            self._fail_all(self.error or EngineDeadError("the engine was stopped"))

    def _run_commands(self, *, first_wait_s: float | None = None, gather_s: float = 0.0) -> None:
        """Run the queued commands: wait up to `first_wait_s` for the first (None: none queued, return), then take
        those that arrive until `gather_s` after it."""
        try:
            fn, future = self._commands.get(timeout=first_wait_s) if first_wait_s else self._commands.get_nowait()
        except queue.Empty:
            return
        deadline = time.monotonic() + gather_s
        while True:
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:  # the caller's error (bad request, refused reset) goes back to it
                future.set_exception(exc)
            try:
                left = deadline - time.monotonic()
                fn, future = self._commands.get(timeout=left) if left > 0 else self._commands.get_nowait()
            except queue.Empty:
                break
        events = self.engine.take_events()  # what aborts and admin calls did to the cache
        if events:
            self._publish(StepResult([], self.engine.current_stats(), events))

    def _end_idle_sessions(self) -> None:
        """An idle engine still ends sessions idle past the horizon (a step does it when requests run)."""
        self.engine.block_manager.expire_idle_sessions()
        events = self.engine.take_events()
        if events:
            self._publish(StepResult([], self.engine.current_stats(), events))

    def _abort(self, engine: LLMEngine, request_id: str) -> None:
        output = engine.abort(request_id)
        if output is not None:
            self._publish(StepResult([output], engine.current_stats(), engine.take_events()))

    def _publish(self, result: StepResult) -> None:
        for out in result.outputs:
            slot = self._requests.get(out.request_id)
            if slot is None:
                continue
            slot.put(out)
            if out.finished:
                del self._requests[out.request_id]
                slot.put(_END)
        for observer in self.observers:
            try:
                observer.on_step(result)
            except Exception:
                log.exception("observer %s failed on a step; continuing", type(observer).__name__)

    def _fail_all(self, exc: BaseException) -> None:
        error = exc if isinstance(exc, EngineDeadError) else EngineDeadError(f"the engine loop failed: {exc!r}")
        for slot in self._requests.values():
            slot.put(error)
        self._requests.clear()
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            future.set_exception(error)
