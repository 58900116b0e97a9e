"""A helper process of kvobs's own: a fresh interpreter running a module of the package (`python -m MODULE FD`),
connected to its parent by a socket pair. Not multiprocessing's spawn, which would run the parent's `__main__` again
in the child (whatever script that is: under Streamlit's AppTest, the app); what the child is told goes over the pair,
never on a command line `ps` shows. The store's write process and the collector's stream workers are such children.

    process, conn = start_child("kvobs.store.sql.write_process")
    conn.send(url); ...
    end_child(process, timeout_s=5.0)     # wait, then kill: these children ignore SIGINT and SIGTERM
"""

from __future__ import annotations

import socket
import subprocess
import sys
from multiprocessing.connection import Connection


def start_child(module: str) -> tuple[subprocess.Popen, Connection]:
    """`python -m MODULE FD`, FD its end of the pair; returns the process and the parent's end."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-m", module, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stdin=subprocess.DEVNULL,
    )
    theirs.close()
    return process, Connection(ours.detach())


def end_child(process: subprocess.Popen, timeout_s: float) -> None:
    """Wait up to `timeout_s` for the child to end, then kill it (it ignores SIGTERM: its parent decides its end)."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10.0)
