"""A command's child processes (`kvobs demo`'s engine, collector and dashboard): each started in a session of its
own with its log in a file, asked whether it is ready (and not whatever else answers on its port), watched while it
runs, and stopped in order.

    child = start(children, command, log_path)
    if not wait_ready(child, url, port, timeout_s, stop, "the engine"): ...   # said on stderr
    watch = Watch(children, stop)      # a child that exits from now on is said, and stops the command
    stop_all(children)

A server that answers the port is the child only when the listening socket is its session's: on Linux that is read
from `/proc` (the socket's inode among the session's open files); elsewhere it cannot be told, and a live child with
an answering port counts as ready.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
LISTEN = "0A"  # a listening socket's state in /proc/net/tcp


class Child(subprocess.Popen):
    """A child: its kvobs command's name and the log file it writes."""

    command: str
    log_path: Path


def start(children: list[Child], command: list[str], log_path: Path) -> Child:
    """Start `command` (`python -m kvobs.cli NAME ...`) in a session of its own (Ctrl-C reaches only us, and we stop
    the children in order), its output appended to `log_path`."""
    with open(log_path, "ab") as log_file:  # the child holds its own descriptor
        log_file.write(f"\n--- started: {' '.join(command[2:])}\n".encode())
        log_file.flush()
        child = Child(
            command, start_new_session=True, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
    child.command, child.log_path = command[3] if command[1:3] == ["-m", "kvobs.cli"] else command[0], log_path
    children.append(child)
    return child


def log_tail(child: Child, num_lines: int = 15) -> str:
    path = child.log_path
    if not path.exists():
        return ""
    lines = path.read_text(errors="replace").splitlines()[-num_lines:]
    return f"\nthe last lines of {path}:\n" + "\n".join("  " + line for line in lines)


def owns_port(child: Child, port: int) -> bool | None:
    """Whether the socket listening on `port` belongs to `child`'s session (it or what it started); None where this
    cannot be told (no /proc)."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    if not inodes:
        return False
    for pid in _session_pids(child.pid):
        with contextlib.suppress(OSError):  # gone, or not ours to read
            for fd in os.listdir(PROC / str(pid) / "fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(PROC / str(pid) / "fd" / fd)
                    if target.startswith("socket:[") and target[8:-1] in inodes:
                        return True
    return False


def _listening_inodes(port: int) -> set[str] | None:
    tables = [PROC / "net" / name for name in ("tcp", "tcp6")]
    if not any(t.exists() for t in tables):
        return None
    found = set()
    for table in tables:
        with contextlib.suppress(OSError):
            for line in table.read_text().splitlines()[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                    found.add(inode)
    return found


def _session_pids(session: int) -> list[int]:
    pids = []
    for entry in os.listdir(PROC):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry)) == session:
                    pids.append(int(entry))
    return pids


def wait_ready(
    child: Child, url: str, port: int, timeout_s: float, stop: threading.Event, what: str, method: str = "GET"
) -> bool:
    """Whether `child` itself answers `url` within `timeout_s` (to a POST, any HTTP answer: a ready collector takes
    the empty export): it must be alive, the URL must answer, and the listening socket must be the child's, so
    another program on the port is never taken for it. Says on stderr why not."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        if child.poll() is not None:
            print(
                f"kvobs demo: {what} exited with status {child.returncode} before it was ready{log_tail(child)}",
                file=sys.stderr,
            )
            return False
        try:
            status = httpx.request(method, url, timeout=2.0).status_code
            if (status == 200 or method == "POST") and owns_port(child, port) is not False:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            print(f"kvobs demo: {what} did not answer {url} within {timeout_s:.0f} s{log_tail(child)}", file=sys.stderr)
            return False
        stop.wait(0.5)
    return False


class Watch:
    """From now on, a child that exits is said on stderr and sets `stop` (the command then exits 1: `failed`)."""

    def __init__(self, children: list[Child], stop: threading.Event, interval_s: float = 1.0) -> None:
        self.children, self.stop, self.interval_s = children, stop, interval_s
        self.failed: Child | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvobs-children", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            for child in self.children:
                if child.poll() is not None:
                    self.failed = child
                    print(
                        f"kvobs demo: kvobs {child.command} exited with status {child.returncode}{log_tail(child)}",
                        file=sys.stderr,
                    )
                    self.stop.set()
                    return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


NAMES = {"serve": "the engine", "collect": "the collector", "dashboard": "the dashboard"}


def stop_all(children: list[Child]) -> list[str]:
    """Stop the children still running, the last started first (the engine last: it flushes); return what was
    stopped, in words."""
    stopped = [NAMES.get(child.command, child.command) for child in reversed(children) if child.poll() is None]
    for child in reversed(children):
        if child.poll() is None:
            _signal_group(child, signal.SIGTERM)  # its whole session: nothing it started outlives the demo
    for child in reversed(children):
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("kvobs %s did not stop within 30 s; killing it", child.command)
            _signal_group(child, signal.SIGKILL)
            child.wait()
    return stopped


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it exited in the meantime
        os.killpg(child.pid, sig)
