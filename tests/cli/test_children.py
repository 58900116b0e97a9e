"""A command's children (`kvobs.commands.children`): the one answering a port is told from another program on it,
and a child that exits is said and stops the command."""

from __future__ import annotations

import socket
import sys
import threading

import pytest

from kvobs.commands.children import Watch, owns_port, start

LISTEN = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(60)"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the socket's owner is read from /proc (Linux)")
def test_the_listening_socket_is_told_to_be_the_childs_or_another_programs(tmp_path):
    with socket.socket() as other:  # another program on the port
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        children = []
        mine = socket.socket()
        mine.bind(("127.0.0.1", 0))
        port = mine.getsockname()[1]
        mine.close()  # (a free port for the child)
        child = start(children, [sys.executable, "-c", LISTEN, str(port)], tmp_path / "child.log")
        try:
            for _ in range(100):
                if owns_port(child, port):
                    break
                threading.Event().wait(0.1)
            assert owns_port(child, port) is True
            assert owns_port(child, taken) is False  # it answers there, but it is not the child
        finally:
            child.kill()
            child.wait()


def test_a_child_that_exits_is_said_and_stops_the_command(tmp_path, capsys):
    children = []
    child = start(children, [sys.executable, "-c", "print('started'); raise SystemExit(3)"], tmp_path / "child.log")
    stop = threading.Event()
    watch = Watch(children, stop, interval_s=0.1)
    assert stop.wait(30)
    watch.close()
    assert watch.failed is child
    err = capsys.readouterr().err
    assert "exited with status 3" in err and "started" in err  # the end of its log, said
