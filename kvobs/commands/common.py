"""What several `kvobs` commands share: the store flag, the extras guard, and reporting a failed start in one line."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Iterable
from typing import TypeVar

from kvobs.semconv.endpoints import DEFAULT_STORE_URL, STORE_URL_ENV
from kvobs.semconv.sessions import SESSION_END_AFTER_S

T = TypeVar("T")


def number(kind: type = float, *, at_least: float | None = None, above: float | None = None):
    """An argparse type: a `kind` number within bounds, else the flag's one-line error ("must be at least 1; got
    0"), before anything is opened or loaded."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if value != value or (at_least is not None and value < at_least):
            raise argparse.ArgumentTypeError(f"must be at least {at_least:g}; got {text}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be more than {above:g}; got {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def available_memory_bytes() -> int | None:
    """Memory this machine can give a process now (Linux `MemAvailable`), else its physical memory; None unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(flag: str, value: int, need_bytes: float, what: str) -> None:
    """`ValueError` when `need_bytes` (what `flag`'s `value` would take) exceeds the memory available now."""
    available = available_memory_bytes()
    if available is not None and need_bytes > available:
        raise ValueError(
            f"{flag} {value:,} would need about {_size(need_bytes)} for {what}; this machine has {_size(available)} "
            "available"
        )


def _size(num_bytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if num_bytes < 1000 or unit == "PB":
            return f"{num_bytes:,.0f} {unit}" if unit == "B" else f"{num_bytes:,.1f} {unit}"
        num_bytes /= 1000
    return ""


def add_store_flag(parser: argparse.ArgumentParser, *, what: str = "", optional: bool = False) -> None:
    """`--store URL`: where the command reads or writes (`what` says which rows, `optional`: no store by default)."""
    default = f"{STORE_URL_ENV}, else none" if optional else f"{STORE_URL_ENV}, else {DEFAULT_STORE_URL}"
    examples = " (e.g. sqlite:///kvobs.db, postgresql://user@host/db)" if optional else ""
    parser.add_argument("--store", help=f"store URL{' for ' + what if what else ''}{examples}; default: {default}")


def add_session_end_flag(parser: argparse.ArgumentParser) -> None:
    """`--session-end-after-s S`: when an idle session counts as ended (engine and collector alike)."""
    parser.add_argument(
        "--session-end-after-s",
        type=float,
        default=SESSION_END_AFTER_S,
        metavar="S",
        help="a session with no request this long has ended: blocks it loses after that are no "
        "tool-pause losses (the agent SDK ends its sessions at once)",
    )


def add_retention_flag(parser: argparse.ArgumentParser) -> None:
    """`--retention-days N`: drop raw KV events older than N days from the store (serve and collect alike)."""
    parser.add_argument(
        "--retention-days",
        type=float,
        metavar="N",
        help="drop raw KV events older than N days from the store, at start and hourly (whole days "
        "on ClickHouse); other tables are kept; default: keep everything",
    )


def add_spool_flag(parser: argparse.ArgumentParser) -> None:
    """`--spool-dir DIR`: the store writer's queue is also written to DIR (serve and collect alike)."""
    parser.add_argument(
        "--spool-dir",
        metavar="DIR",
        help="keep the store writer's queue on disk in DIR, so rows already accepted (OTLP spans "
        "answered 200) survive a SIGKILL or a shutdown while the store is down; written first on the "
        "next start (at least once); default: in memory",
    )


def add_hash_key_flag(parser: argparse.ArgumentParser) -> None:
    """`--hash-key-file FILE`: block hashes are stored keyed with the secret in FILE (serve and collect alike)."""
    parser.add_argument(
        "--hash-key-file",
        metavar="FILE",
        help="store every block hash keyed (HMAC-SHA256) with the secret in FILE (at least 16 bytes), so the store "
        "holds no hash of a prompt's tokens; every writer of one store needs the same file (default: the file "
        "KVOBS_HASH_KEY_FILE names; none: hashes as the engine sent them)",
    )


def lacks_extra(command: str, extra: str, module: str, *, find_only: bool = False) -> bool:
    """Whether `module` (what `kvobs <command>` runs on) cannot be imported for want of the optional dependencies
    in `extra`; if so, one line on stderr names the pip command, so the command exits 2 without a traceback.
    `find_only` only looks the module up (for a program run in another process, such as Streamlit)."""
    try:
        if find_only:
            if importlib.util.find_spec(module) is None:
                raise ImportError(f"No module named {module!r}")
        else:
            importlib.import_module(module)
    except ImportError as exc:
        print(f"kvobs {command} needs the {extra} extra: pip install 'kvobs[{extra}]' ({exc})", file=sys.stderr)
        return True
    return False


def workload_config(args: argparse.Namespace, **given):
    """The agents' `WorkloadConfig` from the workload flags `kvobs agents` and `kvobs demo` share, and `given`
    (base_url, seed, model: what each command decides its own way).

    Raises:
        ValueError: a malformed `--tool-pause-ms`.
    """
    from kvobs.agent.calibrate import DEFAULT_CONCURRENCY
    from kvobs.agent.workload import PauseDistribution, WorkloadConfig

    return WorkloadConfig(
        sessions=args.sessions,
        concurrency=DEFAULT_CONCURRENCY if args.concurrency is None else args.concurrency,
        steps=args.steps,
        tool_pause=PauseDistribution.parse(args.tool_pause_ms),
        step_deadline_s=args.step_deadline_s,
        max_tokens=args.max_tokens,
        **given,
    )


def start_or_report(command: str, start: Callable[[], T]) -> T | None:
    """Run `start`; on a bad configuration, a taken address or an unreachable store print one line (no traceback)
    to stderr and return None, so the command exits 2."""
    from sqlalchemy.exc import OperationalError

    try:
        return start()
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"kvobs {command}: {exc}", file=sys.stderr)
    except OperationalError as exc:
        print(f"kvobs {command}: cannot reach the store: {exc.orig}", file=sys.stderr)
    return None


def check_store(url: str) -> None:
    """Open the store at `url` and close it: before a server's heavy start (torch, the weights), a store it cannot
    open costs a line naming the store, not a minute.

    Raises:
        OSError: the store cannot be opened or reached (its URL, without a password, and why).
        ValueError: an unsupported URL (from `open_store`).
    """
    from sqlalchemy.exc import OperationalError

    from kvobs.store import open_store
    from kvobs.store.db import redacted_url

    try:
        open_store(url).close()
    except OperationalError as exc:
        raise OSError(f"cannot reach the store {redacted_url(url)}: {exc.orig}") from None


def ports_in_use(listeners: Iterable[tuple[str, str, int]]) -> list[str]:
    """Of `(flag, host, port)` listeners, those a server of ours could not listen on now, as `host:port (flag)` (port
    0 picks a free one, so it is never in use). Checked before any heavy work (a model load, a store file), so a
    taken port costs a line, not minutes."""
    return [f"{host}:{port} ({flag})" for flag, host, port in listeners if port and not _is_free(host, port)]


def refuse_ports_in_use(listeners: Iterable[tuple[str, str, int]], hint: str = "stop it or pass other ports") -> None:
    """`OSError` naming every taken listener in one message (for `start_or_report`), or nothing."""
    taken = ports_in_use(listeners)
    if taken:
        raise OSError(f"already in use: {', '.join(taken)}; {hint}")


def _is_free(host: str, port: int) -> bool:
    """Whether we could bind `host:port` now (a server already there would also answer our readiness checks)."""
    bind_host = "" if host in ("0.0.0.0", "*") else host
    with socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET) as probe:
        if os.name != "nt":  # as the servers bind: a port left in TIME_WAIT by a killed server is free again
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind_host, port))
        except OSError:
            return False
    return True
