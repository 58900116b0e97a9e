"""Pull an engine's KV events over HTTP: TensorRT-LLM's `POST /kv_cache_events`, which answers the events since the
last call (its queue drained), decoded through its adapter at the door (`kvobs.trtllm.normalize`).

    poller = KVEventPoller("http://trtllm:8000", handle, drops)
    poller.start()     # a thread asks every `interval_s`; handle(seq, batch) runs on it, for each batch with events
    poller.stop()

It stands where the ZMQ subscriber stands (`collectors.kv.subscriber`: the same handler, drop counter and counts),
so nothing after it knows which engine spoke. The engine numbers its events (`event_id`): a jump forward means
events its bounded queue (`event_buffer_max_size`) dropped before they were fetched, counted in `num_lost` and said
once a gap; a number going back means a new engine (its restart), after which its ids start over (`on_restart()`).
An answer that is no JSON list, or a failed call, is counted in `drops` and the next call goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx

from collectors.drops import DropCounter
from collectors.kv.subscriber import COMPONENT, BatchHandler
from kvobs.trtllm.normalize import DecodeError, TrtllmAdapter

log = logging.getLogger(__name__)

INTERVAL_S = 0.5  # between calls: TensorRT-LLM keeps events in a bounded queue until asked
TIMEOUT_S = 10.0
PATH = "/kv_cache_events"


class KVEventPoller:
    bind = False  # (it calls the engine, as a subscriber that connects)

    def __init__(
        self,
        endpoint: str,
        handle: BatchHandler,
        drops: DropCounter,
        *,
        interval_s: float = INTERVAL_S,
        on_restart: Callable[[], None] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.handle, self.drops, self.interval_s, self.on_restart = handle, drops, interval_s, on_restart
        self.adapter = TrtllmAdapter()
        self.client = client or httpx.Client(timeout=TIMEOUT_S)
        self.num_batches = 0
        self.num_events = 0
        self.num_lost = 0  # events the engine numbered and never answered (its queue overflowed)
        self.num_gaps = 0
        self.num_restarts = 0
        self.num_failed_calls = 0
        self.shapes: Counter[str] = Counter()
        self.lag_s: float | None = None  # never known: the events carry no time of their own (not shown as 0)
        self.last_batch_at: float | None = None
        self.handling_since: float | None = None  # (as the subscriber's: a stream busy storing is not silent)
        self._seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvobs-kv-poller", daemon=True)

    def start(self) -> None:
        log.info("KV events: calling %s%s every %.1f s (TensorRT-LLM)", self.endpoint, PATH, self.interval_s)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll()
            except Exception as exc:  # one answer must never end the stream
                log.exception("KV events from %s could not be handled; skipped", self.endpoint)
                self.drops.count(COMPONENT, "handler_error", repr(exc))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def poll(self) -> int:
        """One call: fetch, decode and hand on what the engine queued; returns the events handed on."""
        try:
            response = self.client.post(self.endpoint + PATH)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            self.num_failed_calls += 1
            self.drops.count(COMPONENT, "poll_failed", f"{self.endpoint}{PATH}: {exc}")
            return 0
        before = self.adapter.last_event_id
        try:
            batch, unknown, refused, shape, num_events = self.adapter.decode(response.content, time.time())
        except DecodeError as exc:
            self.drops.count(COMPONENT, "malformed_batch", str(exc))
            return 0
        if unknown:
            self.drops.count(COMPONENT, "unknown_event_type", f"{unknown} event(s) from {self.endpoint}", n=unknown)
        if refused:
            self.drops.count(COMPONENT, "bad_event", f"{refused} malformed event(s) from {self.endpoint}", n=refused)
        self._check_numbers(before, self.adapter.first_event_id)
        if not batch.events:
            return 0
        self.num_events += num_events
        self.shapes[shape] += 1
        self.last_batch_at = self.handling_since = time.monotonic()
        self._seq += 1
        try:
            self.handle(self._seq, batch)
        finally:  # (counted once handled, as the subscriber counts)
            self.num_batches += 1
            self.handling_since = None
        return num_events

    def _check_numbers(self, before: int | None, first: int | None) -> None:
        """Gaps and restarts: the answer's first event id against the last one decoded before it."""
        if first is None or before is None:
            return
        if first <= before:
            self.num_restarts += 1
            log.warning(
                "KV events from %s: event ids went back from %d to %d: the engine restarted",
                self.endpoint,
                before,
                first,
            )
            if self.on_restart is not None:
                self.on_restart()
        elif first > before + 1:
            lost = first - before - 1
            self.num_gaps += 1
            self.num_lost += lost
            log.warning(
                "KV events from %s: %d event(s) lost between id %d and %d (the engine's event_buffer_max_size was "
                "full before they were fetched)",
                self.endpoint,
                lost,
                before,
                first,
            )
