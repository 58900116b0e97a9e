"""Publish the engine's KV events on ZMQ in vLLM's wire format, with a replay socket.

    publisher = KVEventPublisher("tcp://*:5557", replay_endpoint="tcp://*:5558", topic="kv")
    publisher.start()                      # a thread owns the sockets
    publisher.on_step(step_result)         # AsyncEngine observer: queue the step's events
    publisher.close()                      # sends what is queued, then closes

Mapping from engine events: `BlocksStored` -> `BlockStored` (with the request's `session_id`),
`BlockEvicted` -> one `BlockRemoved` per block (whatever the reason: capacity, invalidation,
session release, TTL), `CacheCleared` -> `AllBlocksCleared`; the offload tier's `TierStored` and `TierRemoved` ->
what vLLM's offloading connector publishes (`medium` `CPU`: placeholders, or self-describing stores). Other engine
events (lookups, allocations, frees, preemptions, tier loads) have no vLLM counterpart and are not published, as in
vLLM.

Each batch is stamped with its events' own time, not the time it is sent: a step's events that happened at different
moments (an eviction while scheduling, the stores after the forward pass) go in batches of their own, in order. A
subscriber places each event at its batch's time; stamped a step late, a block evicted before a session's next request
arrived (stamped as the HTTP side takes it) would read as lost after it. vLLM stamps the send.

The PUB socket binds when the endpoint is a wildcard (`tcp://*:5557`) or local transport, and
otherwise connects to a subscriber that bound it (vLLM's rule). Each published batch gets the next
sequence number and is kept in a ring of `buffer_steps` batches for replay requests.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import groupby
from typing import Any

import zmq

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.stats import StepResult
from kvobs.semconv.reasons import EvictionReason
from kvobs.vllm import kv_events as wire

log = logging.getLogger(__name__)

POLL_MS = 100


def _stored(event: ev.BlocksStored, omit_token_ids: bool = False) -> wire.Event:
    return _described(event, omit_token_ids, extra_keys=[None] * len(event.block_hashes), session_id=event.session_id)


def _described(event: ev.BlocksStored | ev.TierStored, omit_token_ids: bool, **fields) -> wire.BlockStored:
    """A `BlockStored` with the blocks' tokens and chain (the cache's, or a tier's self-describing one)."""
    return wire.BlockStored(
        block_hashes=list(event.block_hashes),
        parent_block_hash=event.parent_block_hash,
        token_ids=[] if omit_token_ids else list(event.token_ids),
        block_size=event.block_size,
        lora_id=None,
        medium=event.medium,
        lora_name=event.adapter,
        group_idx=ev.KV_CACHE_GROUP,
        kv_cache_spec_kind=ev.KV_CACHE_SPEC_KIND,
        **fields,
    )


def _removed(event: ev.BlockEvicted, _omit_token_ids: bool = False) -> wire.Event:
    """vLLM's BlockRemoved; a block not simply taken for room also says why (`reason`, kvobs's extension)."""
    reason = None if event.store_reason == EvictionReason.CAPACITY.value else event.store_reason
    return wire.BlockRemoved(
        block_hashes=[event.block_hash], medium=event.medium, group_idx=ev.KV_CACHE_GROUP, reason=reason
    )


def _cleared(_event: ev.CacheCleared, _omit_token_ids: bool = False) -> wire.Event:
    return wire.AllBlocksCleared()


def _tier_stored(event: ev.TierStored, omit_token_ids: bool = False) -> list[wire.Event]:
    """vLLM's offloading connector's stores: self-describing (one event a chain, tokens and parent, as vLLM's
    `self_describing_kv_events`), else its placeholders (one a block: the hash alone, no tokens, block size 0).
    Neither names a session: vLLM's connector does not."""
    if event.described:
        return [_described(event, omit_token_ids)]
    return [
        wire.BlockStored(
            block_hashes=[block_hash],
            parent_block_hash=None,
            token_ids=[],
            block_size=0,
            lora_id=None,
            medium=event.medium,
            lora_name=None,
            group_idx=ev.KV_CACHE_GROUP,
        )
        for block_hash in event.block_hashes
    ]


def _tier_removed(event: ev.TierRemoved, _omit_token_ids: bool = False) -> wire.Event:
    """The connector's removal: one event of the hashes (vLLM's `BlockRemoved(block_hashes=keys, medium=...)`)."""
    reason = None if event.reason is None else event.reason.value
    return wire.BlockRemoved(
        block_hashes=list(event.block_hashes), medium=event.medium, group_idx=ev.KV_CACHE_GROUP, reason=reason
    )


# Engine event type -> its vLLM wire event or events (the only engine events vLLM publishes).
WIRE_EVENTS: dict[type, Callable[[Any, bool], wire.Event | list[wire.Event]]] = {
    ev.BlocksStored: _stored,
    ev.BlockEvicted: _removed,
    ev.CacheCleared: _cleared,
    ev.TierStored: _tier_stored,
    ev.TierRemoved: _tier_removed,
}


def to_wire_events(events: list[ev.KVEvent], *, omit_token_ids: bool = False) -> list[wire.Event]:
    """The vLLM events for a list of engine events, in order; `omit_token_ids` sends `BlockStored` with an empty
    `token_ids` (the prompt's tokens stay off the wire; consumers that only follow hashes lose nothing)."""
    out: list[wire.Event] = []
    for event in events:
        convert = WIRE_EVENTS.get(type(event))
        if convert is not None:
            sent = convert(event, omit_token_ids)
            out.extend(sent) if isinstance(sent, list) else out.append(sent)
    return out


class KVEventPublisher:
    """A PUB socket (and optional ROUTER replay socket) served by one background thread.

    Args:
        endpoint: where to publish, e.g. "tcp://*:5557" (bind) or "tcp://collector:5557" (connect).
        replay_endpoint: ROUTER socket for replay requests (always bound); None disables replay.
        topic: first frame of every message.
        buffer_steps: batches kept for replay.
        max_queue: batches waiting to be sent; beyond it new batches are dropped and counted.
        data_parallel_rank: third field of every batch.
        omit_token_ids: publish `BlockStored` without its token ids (they are the prompt's text, readable by any
            subscriber of the socket).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        max_queue: int = 100_000,
        data_parallel_rank: int | None = 0,
        omit_token_ids: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.dp_rank = data_parallel_rank
        self.omit_token_ids = omit_token_ids
        self.num_dropped = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=max_queue)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._ctx: zmq.Context = zmq.Context.instance()
        self._thread = threading.Thread(target=self._serve, name="kvobs-kv-events", daemon=True)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    def start(self) -> None:
        """Open the sockets on the publisher thread; raises if they cannot be bound or connected."""
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def on_step(self, result: StepResult) -> None:
        for ts, happened in groupby(result.events, key=lambda event: event.ts):  # a batch per moment, in order
            events = to_wire_events(list(happened), omit_token_ids=self.omit_token_ids)
            if events:
                self.publish(events, ts)

    def publish(self, events: list[wire.Event], ts: float) -> None:
        """Queue a batch of `events` that happened at `ts` (epoch seconds)."""
        payload = wire.encode_batch(wire.KVEventBatch(ts, events, self.dp_rank))
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            self.num_dropped += 1
            log.warning("KV-event queue full; dropped a batch of %d events", len(events))

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued, then close the sockets."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout_s)

    # ---- the publisher thread -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            pub = self._ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 1000)
            pub.bind(self.endpoint) if wire.should_bind(self.endpoint) else pub.connect(self.endpoint)
            replay = None
            if self.replay_endpoint:
                replay = self._ctx.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            self._start_error = OSError(f"cannot open the KV-event socket {self.endpoint}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        log.info("publishing KV events on %s (replay: %s)", self.endpoint, self.replay_endpoint or "off")
        poller = zmq.Poller()
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        try:
            while True:
                if not self._send_queued(pub):
                    break
                if replay is not None and dict(poller.poll(POLL_MS if self._queue.empty() else 0)):
                    self._answer_replay(replay)
                elif replay is None and self._queue.empty():
                    time.sleep(POLL_MS / 1000)
        finally:
            pub.close()
            if replay is not None:
                replay.close()

    def _send_queued(self, pub: zmq.Socket) -> bool:
        """Send every queued batch; False once `close()` asked to stop."""
        while True:
            try:
                payload = self._queue.get_nowait()
            except queue.Empty:
                return True
            if payload is None:
                return False
            seq = self._next_seq
            self._next_seq += 1
            pub.send_multipart((self.topic, wire.seq_bytes(seq), payload))
            self._buffer.append((seq, payload))

    def _answer_replay(self, replay: zmq.Socket) -> None:
        """vLLM 0.33's reply: `(topic, seq, payload)` per buffered batch from the asked seq, then the end mark."""
        frames = replay.recv_multipart()
        envelope, body = _split_envelope(frames)
        if len(body) != 1 or len(body[0]) != 8:
            log.warning("malformed replay request (%d frames); ignored", len(frames))
            return
        start = wire.seq_from_bytes(body[0])
        for seq, payload in list(self._buffer):
            if seq >= start:
                replay.send_multipart((*envelope, self.topic, wire.seq_bytes(seq), payload))
        replay.send_multipart((*envelope, b"", wire.REPLAY_END, b""))


def _split_envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """ROUTER frames: identity, then an empty delimiter from REQ clients (DEALERs may omit it), then the body."""
    identity, rest = frames[:1], frames[1:]
    if rest and rest[0] == b"":
        return [*identity, b""], rest[1:]
    return identity, rest
