"""Subscribe to vLLM's ZMQ KV-event stream; fill sequence gaps through the replay socket.

    subscriber = KVEventSubscriber("tcp://vllm:5557", handle, drops, replay_endpoint="tcp://vllm:5558")
    subscriber.start()     # a thread receives, checks, decodes; handle(seq, batch) runs on it, in sequence order
    subscriber.stop()

`decode` is the engine's adapter at the door: a payload -> normalized events (`kvobs.block_events`); vLLM's
(`kvobs.vllm.normalize.decode`) by default, and any engine that publishes vLLM's framing (topic, 8-byte sequence,
payload) plugs its own in.

Connect or bind: vLLM binds a wildcard endpoint (`tcp://*:5557`: we connect to `tcp://host:5557`) and
connects to a concrete one (then we bind it); `bind=None` follows vLLM's rule from the endpoint we are given
(`tcp://*:5557` here means: bind).

Sequence numbers: a jump forward is a gap; with a replay endpoint the subscriber asks the publisher's ROUTER for
everything from the first missing number (both reply forms: `(topic, seq, payload)` of 0.33, `(seq, payload)` of
0.24 and earlier, until the end mark) and delivers it in order before going on; the live copies of replayed batches
are then skipped. Batches the replay cannot supply are counted in `num_lost`. A lost tail (the last batches of a
burst, with no later number to reveal the gap) is asked for once the stream has been quiet for `tail_check_s`: what
the replay returns is delivered (`num_tail_recovered`), and a live copy still on its way is skipped when it comes;
without a replay endpoint such a tail cannot be known.

A restart is told from a duplicate by what follows: a publisher that restarted numbers from 0 again, so a number
going back to 0, or going back and then followed by its successor, means the publisher restarted (`on_restart()` is
called and numbering starts over); a number going back that the stream then leaves behind (the next one is the
expected one) was a duplicate, counted under `duplicate_sequence` and skipped. Until the next message decides, the
backward batch is held.

Bad input (wrong frame count, a sequence frame that is not 8 bytes, a payload that is not a batch, unknown
event types) is counted in `drops` under `kv_events` and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import zmq

from collectors.drops import DropCounter
from kvobs.block_events import Batch, Decoded
from kvobs.vllm import kv_events as wire
from kvobs.vllm import normalize

log = logging.getLogger(__name__)

COMPONENT = "kv_events"
POLL_MS = 100
RCVHWM = 100_000  # batches ZMQ queues for us: vLLM's publisher keeps as many (its send high-water mark)
TAIL_CHECK_S = 2.0

BatchHandler = Callable[[int, Batch], None]


class KVEventSubscriber:
    """Args:
    endpoint: the publisher's endpoint (`tcp://host:5557`), or ours to bind (`tcp://*:5557`).
    handle: called with (seq, batch) for every batch, in order, on the subscriber thread.
    drops: where skipped input is counted.
    bind: True binds, False connects; None decides from the endpoint (vLLM's rule, mirrored).
    replay_endpoint: the publisher's ROUTER replay socket; None: gaps are counted, not filled.
    topic: subscribe to this topic prefix ("" = everything).
    replay_timeout_s: how long one replay may take before giving up on it.
    on_restart: called when the publisher's numbering starts over.
    tail_check_s: quiet time after which the replay is asked for batches after the last one received.
    decode: the engine's adapter (a payload -> `Decoded`; raises `kv_events.DecodeError` on one that is no batch).
    resume_from: the first sequence number wanted (a gap before the first batch received is then filled).
    """

    def __init__(
        self,
        endpoint: str,
        handle: BatchHandler,
        drops: DropCounter,
        *,
        bind: bool | None = None,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        on_restart: Callable[[], None] | None = None,
        tail_check_s: float = TAIL_CHECK_S,
        decode: Callable[[bytes], Decoded] = normalize.decode,
        resume_from: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.handle = handle
        self.drops = drops
        self.bind = wire.should_bind(endpoint) if bind is None else bind
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.on_restart = on_restart
        self.tail_check_s = tail_check_s
        self.decode = decode
        self.num_batches = 0
        self.shapes: Counter[str] = Counter()  # batches by wire shape (`kvobs.vllm.kv_events.WIRE_SHAPES`)
        self.lag_s: float | None = None  # the latest batch's age when it arrived
        self.clock: Callable[[], float] = time.time  # what a batch's age is read against (an import: its capture's)
        self.last_batch_at: float | None = None  # monotonic time of the latest batch delivered (None: none yet)
        self.handling_since: float | None = None  # monotonic time the batch being handled now arrived (None: idle)
        self.num_tail_recovered = 0
        self.num_events = 0
        self.num_gaps = 0
        self.num_replayed = 0
        self.num_lost = 0
        self.num_restarts = 0
        # the first batch expected: a restarted worker's, after the last its collector acknowledged (so the replay
        # fills what it had not handed on); None: whatever comes first
        self._expected: int | None = resume_from
        self._replayed: set[int] = set()
        self._held: tuple[int, bytes] | None = None  # a batch whose number went back: a restart or a duplicate?
        self._ctx: zmq.Context = zmq.Context.instance()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvobs-kv-subscriber", daemon=True)

    # ---- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the socket on the subscriber thread; raises OSError when it cannot bind or connect."""
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():  # (never started: its collector's start was refused)
            self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            sub = self._ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVHWM, RCVHWM)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            sub.bind(self.endpoint) if self.bind else sub.connect(self.endpoint)
        except zmq.ZMQError as exc:
            self._start_error = OSError(f"cannot {'bind' if self.bind else 'connect'} {self.endpoint}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        log.info(
            "KV events: %s %s (replay: %s)",
            "bound" if self.bind else "connected to",
            self.endpoint,
            self.replay_endpoint or "off",
        )
        tail_checked, last_received = self._expected is None, time.monotonic()  # (resumed: ask for the tail too)
        try:
            while not self._stop.is_set():
                if sub.poll(POLL_MS):
                    try:
                        self.receive(sub.recv_multipart())
                    except Exception as exc:  # one message must never end the stream
                        log.exception("a KV-event message could not be handled; skipped")
                        self.drops.count(COMPONENT, "handler_error", repr(exc))
                    tail_checked, last_received = False, time.monotonic()
                elif not tail_checked and time.monotonic() - last_received >= self.tail_check_s:
                    tail_checked = True
                    self._check_tail()
        finally:
            sub.close()

    # ---- one message ----------------------------------------------------------------------------------
    def receive(self, frames: list[bytes]) -> None:
        """One message as the socket gave it (topic, sequence, payload), or as a capture recorded it."""
        if len(frames) != 3:
            self.drops.count(COMPONENT, "bad_frame_count", f"expected 3 frames, got {len(frames)}")
            return
        try:
            seq = wire.seq_from_bytes(frames[1])
        except wire.DecodeError as exc:
            self.drops.count(COMPONENT, "bad_sequence", str(exc))
            return
        if seq in self._replayed:
            self._replayed.discard(seq)  # the live copy of a batch the replay already delivered
            return
        if self._held is not None:
            held, self._held = self._held, None
            if seq == held[0] + 1:  # the lower numbering goes on: the publisher restarted
                self._restarted(held[0])
                self._deliver(*held)
            else:
                self.drops.count(COMPONENT, "duplicate_sequence", f"batch {held[0]} again, then {seq}")
        if self._expected is not None and seq < self._expected:
            if seq != 0:
                self._held = (seq, frames[2])  # the next message tells a restart from a duplicate
                return
            self._restarted(seq)
        elif self._expected is not None and seq > self._expected:
            self._fill_gap(self._expected, seq)
            if seq in self._replayed:
                self._replayed.discard(seq)
                return
        if self._replayed:
            self._replayed = {s for s in self._replayed if s > seq}
        self._deliver(seq, frames[2])

    def _restarted(self, seq: int) -> None:
        self.num_restarts += 1
        self._replayed.clear()
        log.warning("KV-event sequence went back from %d to %d: the publisher restarted", self._expected, seq)
        if self.on_restart is not None:
            self.on_restart()

    def _deliver(self, seq: int, payload: bytes) -> None:
        self._expected = seq + 1
        try:
            batch, unknown, refused, shape, num_events = self.decode(payload)
        except wire.DecodeError as exc:
            self.drops.count(COMPONENT, "malformed_batch", str(exc))
            return
        if unknown:
            self.drops.count(COMPONENT, "unknown_event_type", f"{unknown} event(s) in batch {seq}", n=unknown)
        if refused:
            self.drops.count(
                COMPONENT, "bad_event", f"{refused} malformed or out-of-range event(s) in batch {seq}", n=refused
            )
        self.shapes[shape] += 1
        self.lag_s = self.clock() - batch.ts  # the publisher's clock to ours: queueing, the network, clock skew
        self.last_batch_at = self.handling_since = time.monotonic()
        self.num_events += num_events
        try:
            self.handle(seq, batch)
        finally:  # (counted once handled: a reader waiting for N batches finds their rows made)
            self.num_batches += 1
            self.handling_since = None

    # ---- gaps -------------------------------------------------------------------------------------------
    def _check_tail(self) -> None:
        """After a quiet spell: batches published after the last one we received were lost on the way; replay them."""
        if self.replay_endpoint is None or self._expected is None:
            return
        first = self._expected
        got = self._replay(first, 2**63 - 1)
        if got:
            self.num_tail_recovered += got
            log.warning("KV events: %d batches from %d on never arrived live; recovered by replay", got, first)

    def _fill_gap(self, first_missing: int, arrived: int) -> None:
        self.num_gaps += 1
        missing = arrived - first_missing
        got = self._replay(first_missing, arrived) if self.replay_endpoint else 0
        if got < missing:
            self.num_lost += missing - got
            log.warning(
                "KV events %d..%d lost (%d of %d recovered by replay)", first_missing, arrived - 1, got, missing
            )

    def _replay(self, start: int, stop: int) -> int:
        """Ask for batches from `start`; deliver those before `stop` in order; return how many were delivered."""
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        delivered = 0
        try:
            dealer.connect(self.replay_endpoint)
            dealer.send_multipart((b"", wire.seq_bytes(start)))
            deadline = time.monotonic() + self.replay_timeout_s
            while (left := deadline - time.monotonic()) > 0 and dealer.poll(int(left * 1000)):
                reply = _replay_body(dealer.recv_multipart())
                if reply is None:
                    self.drops.count(COMPONENT, "bad_replay_reply")
                    continue
                seq, payload = reply
                if seq == -1:
                    break
                if start <= seq < stop and seq >= (self._expected or 0):
                    self._replayed.add(seq)  # its live copy may still be on the way (a tail check races it)
                    self._deliver(seq, payload)
                    delivered += 1
                    self.num_replayed += 1
                elif seq >= stop:
                    self._replayed.add(seq)
                    self._deliver(seq, payload)
        except zmq.ZMQError as exc:
            log.warning("KV-event replay from %s failed: %s", self.replay_endpoint, exc)
        finally:
            dealer.close()
        return delivered


def _replay_body(frames: list[bytes]) -> tuple[int, bytes] | None:
    """(seq, payload) of a replay reply in either form; seq -1 is the end mark."""
    if frames and frames[0] == b"":
        frames = frames[1:]
    if len(frames) == 3:
        frames = frames[1:]  # 0.33: topic, seq, payload
    if len(frames) != 2 or len(frames[0]) != 8:
        return None
    return wire.seq_from_bytes(frames[0]), frames[1]
