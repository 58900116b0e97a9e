"""Messages both ways between the collector and a stream worker (`collectors.kv.workers`), over one connection.

    channel = Channel(conn, handle, name="kvobs-worker-0")
    channel.start()                      # a thread reads; `handle(kind, args)` answers what the other side sends
    channel.tell("rows", instance, seq, columns)        # one way, in order with every other message sent
    verdicts = channel.call("idle_verdicts", losses)   # waits for the other side's answer

A told message is handled on the reading thread, in the order sent (a stream's rows before its snapshot's answer). A
call is handled on a thread of its own, so a handler may call back across the channel (a worker's snapshot asks the
collector's session activity) without blocking the reads its answer needs. When the connection ends (the other
process died or closed it), every call waiting raises `ChannelClosed` and `on_closed` runs once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 300.0  # a call's answer: a snapshot classifying a backlog, a restart's rebuild reading windows
HANDLER_THREADS = 4


class ChannelClosed(ConnectionError):
    """The other side is gone: what was asked of it has no answer."""


class RemoteError(RuntimeError):
    """The other side's handler raised; its message is this one's."""


class Channel:
    def __init__(
        self,
        conn: Connection,
        handle: Callable[[str, tuple], Any],
        *,
        name: str,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        self._conn = conn
        self._handle = handle
        self._on_closed = on_closed
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._waiting: dict[int, tuple[threading.Event, list]] = {}
        self._waiting_lock = threading.Lock()
        self.closed = threading.Event()
        self._calls = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix=f"{name}-call")
        self._thread = threading.Thread(target=self._read, name=f"{name}-read", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def tell(self, kind: str, *args) -> None:
        self._send(("tell", kind, args))

    def call(self, kind: str, *args, timeout_s: float = CALL_TIMEOUT_S):
        """The other side's answer to `kind(*args)`; raises `ChannelClosed`, `RemoteError` or `TimeoutError`."""
        call_id, answered = next(self._ids), threading.Event()
        box: list[tuple[bool, Any]] = []
        with self._waiting_lock:
            if self.closed.is_set():
                raise ChannelClosed(f"{kind}: the other side is gone")
            self._waiting[call_id] = (answered, box)
        try:
            self._send(("call", call_id, kind, args))
            if not answered.wait(timeout_s):
                raise TimeoutError(f"{kind}: no answer in {timeout_s:.0f} s")
        finally:
            with self._waiting_lock:
                self._waiting.pop(call_id, None)
        if not box:
            raise ChannelClosed(f"{kind}: the other side ended before it answered")
        ok, value = box[0]
        if not ok:
            raise RemoteError(value)
        return value

    def close(self) -> None:
        """Close our end: a shutdown first, which ends the reads blocked on it here and there (a plain close of a
        descriptor another thread reads from does neither)."""
        with contextlib.suppress(OSError, ValueError):
            end = socket.socket(fileno=os.dup(self._conn.fileno()))
            try:
                end.shutdown(socket.SHUT_RDWR)
            finally:
                end.close()
        with contextlib.suppress(OSError):
            self._conn.close()
        self._calls.shutdown(wait=False)

    def _send(self, message) -> None:
        try:
            with self._send_lock:
                self._conn.send(message)
        except (OSError, ValueError) as exc:  # (ValueError: our end was closed)
            raise ChannelClosed(f"sending {message[1]}: {exc}") from None

    def _read(self) -> None:
        try:
            while True:
                message = self._conn.recv()
                if message[0] == "answer":
                    with self._waiting_lock:
                        waiting = self._waiting.get(message[1])
                    if waiting is not None:
                        waiting[1].append(message[2])
                        waiting[0].set()
                elif message[0] == "call":
                    self._calls.submit(self._answer, *message[1:])
                else:
                    self._told(message[1], message[2])
        except (EOFError, OSError):
            pass
        finally:
            with self._waiting_lock:
                self.closed.set()
                for answered, _ in self._waiting.values():
                    answered.set()
            if self._on_closed is not None:
                self._on_closed()

    def _told(self, kind: str, args: tuple) -> None:
        try:
            self._handle(kind, args)
        except Exception:  # one message must never end the channel
            log.exception("handling %s from the other side failed", kind)

    def _answer(self, call_id: int, kind: str, args: tuple) -> None:
        try:
            reply = (True, self._handle(kind, args))
        except Exception as exc:
            log.exception("answering %s failed", kind)
            reply = (False, f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(ChannelClosed):  # (the other side is gone: nobody waits for it)
            self._send(("answer", call_id, reply))
