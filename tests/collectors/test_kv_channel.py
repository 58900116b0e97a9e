"""The channel between the collector and a stream worker, over a real socket pair: told messages are handled in the
order sent, before a later call's answer; a handler may call back across (a worker's snapshot asks the collector's
session activity) without blocking the reads its answer needs; a call whose other side goes away raises."""

from __future__ import annotations

import socket
import threading
from multiprocessing.connection import Connection

import pytest

from collectors.kv.channel import Channel, ChannelClosed, RemoteError


def pair(handle_a, handle_b) -> tuple[Channel, Channel]:
    a, b = socket.socketpair()
    ours = Channel(Connection(a.detach()), handle_a, name="test-a")
    theirs = Channel(Connection(b.detach()), handle_b, name="test-b")
    ours.start()
    theirs.start()
    return ours, theirs


def test_told_messages_come_in_order_before_a_later_answer():
    seen: list[int] = []

    def worker_side(kind, args):
        if kind == "row":
            seen.append(args[0])
            return None
        return list(seen)

    ours, _ = pair(lambda kind, args: None, worker_side)
    for i in range(500):
        ours.tell("row", i)
    assert ours.call("seen") == list(range(500))


def test_a_handler_calls_back_across_the_channel_while_its_caller_waits():
    def collector_side(kind, args):
        assert kind == "verdict"
        return f"pause for {args[0]}"

    holder: dict = {}

    def worker_side(kind, args):
        return [holder["worker"].call("verdict", session) for session in args[0]]

    ours, theirs = pair(collector_side, worker_side)
    holder["worker"] = theirs
    assert ours.call("snapshot", ["s1", "s2"]) == ["pause for s1", "pause for s2"]


def test_a_handlers_error_comes_back_as_remote_error_and_the_channel_goes_on():
    def worker_side(kind, args):
        if kind == "bad":
            raise ValueError("no such stream")
        return "fine"

    ours, _ = pair(lambda kind, args: None, worker_side)
    with pytest.raises(RemoteError, match="ValueError: no such stream"):
        ours.call("bad")
    assert ours.call("good") == "fine"


def test_a_call_whose_other_side_goes_away_raises_channel_closed():
    release = threading.Event()
    closed = threading.Event()

    def worker_side(kind, args):
        release.wait(5)
        return "too late"

    a, b = socket.socketpair()
    ours = Channel(Connection(a.detach()), lambda kind, args: None, name="test-a", on_closed=closed.set)
    theirs = Channel(Connection(b.detach()), worker_side, name="test-b")
    ours.start()
    theirs.start()
    threading.Timer(0.2, theirs.close).start()  # the worker's end goes away while the call waits
    with pytest.raises(ChannelClosed):
        ours.call("snapshot", timeout_s=10)
    release.set()
    assert closed.wait(5)
    with pytest.raises(ChannelClosed):
        ours.call("snapshot")
