"""Two ways to reach ClickHouse, one interface: a server over HTTP (`clickhouse-connect`) and chDB in-process.

    client = ChdbClient("/var/lib/kvobs/ch")                 # or HttpClient(host, port, user, password, database)
    client.command("CREATE TABLE ...")
    frame = client.query_df("SELECT count() AS n FROM kv_events WHERE ts >= {since:Float64}", {"since": 0.0})
    client.insert("kv_events", arrow_table, token="writer-1-42")   # a retried token is not inserted twice

Queries use ClickHouse's server-side parameters (`{name:Type}`), so values are never pasted into SQL. Inserts are
column-oriented Arrow tables. A server that cannot be reached raises `StoreUnreachable` (the writer retries it);
anything else ClickHouse refuses raises its own error.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import logging
import re
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

log = logging.getLogger(__name__)


class StoreUnreachable(ConnectionError):
    """The ClickHouse server cannot be reached (refused, timed out, gone away): worth retrying."""


class ChdbClient:
    """ClickHouse's engine in this process, on the data directory `path` (one process at a time per directory).

    One session serves one statement at a time: an insert is streamed over several calls, and a query from another
    thread meanwhile (a collector's tick beside its writer) fails with "Another streaming query or insert is already
    active", so every call holds the client's lock."""

    def __init__(self, path: str, *, insert_settings: dict[str, int] | None = None) -> None:
        self.insert_settings = dict(insert_settings or {})
        self._lock = threading.RLock()
        session = _require("chdb.session", "chdb:/// stores")

        try:
            self._session = session.Session(path)
            self._session.query("SELECT 1")
        except Exception as exc:  # chDB's own error only says it could not start; the lock is the usual cause
            status = Path(path) / "status"
            if _locked(status):
                raise ValueError(
                    f"chDB store {path!r} is open in another process (it holds the lock on {status}); stop that "
                    "process, or share the store through a ClickHouse server (clickhouse://host:8123/db)"
                ) from exc
            raise

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._session.query(sql, "CSV", params=_chdb_params(params))

    def query_df(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        with self._lock:
            return self._session.query(sql, "DataFrame", params=_chdb_params(params))

    def insert(self, table: str, data: pa.Table, *, token: str | None = None) -> None:
        given = [f"{name}={int(value)}" for name, value in self.insert_settings.items()]
        given += [f"insert_deduplication_token='{_plain(token)}'"] if token else []
        settings = f" SETTINGS {', '.join(given)}" if given else ""
        stream = _arrow_stream(data)
        with self._lock:
            inserter = self._session.send_insert(
                f"INSERT INTO {table} ({', '.join(data.column_names)}){settings}", "ArrowStream"
            )
            inserter.append(stream)
            inserter.finish()

    def close(self) -> None:
        with self._lock:
            self._session.close()


class HttpClient:
    """A ClickHouse server over HTTP, with the official `clickhouse-connect` client."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str,
        password: str,
        database: str,
        *,
        insert_settings: dict[str, int] | None = None,
    ) -> None:
        self.insert_settings = dict(insert_settings or {})
        clickhouse_connect = _require("clickhouse_connect", "clickhouse:// stores")
        from clickhouse_connect.driver.exceptions import OperationalError

        self._unreachable = OperationalError
        self._where = f"{host}:{port}"
        _mute_libraries()
        try:
            with _quiet():
                self._client = clickhouse_connect.get_client(
                    host=host, port=port, username=username, password=password, database=database
                )
        except OperationalError as exc:
            raise StoreUnreachable(f"ClickHouse at {self._where} cannot be reached: {_cause(exc)}") from exc

    def command(self, sql: str, params: dict[str, Any] | None = None) -> None:
        self._call(self._client.command, sql, parameters=params)

    def query_df(self, sql: str, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self._call(self._client.query_df, sql, parameters=params)

    def insert(self, table: str, data: pa.Table, *, token: str | None = None) -> None:
        settings = {**self.insert_settings, **({"insert_deduplication_token": token} if token else {})}
        self._call(self._client.insert_arrow, table, data, settings=settings or None)

    def close(self) -> None:
        self._client.close()

    def _call(self, method, *args, **kwargs):
        try:
            with _quiet():
                return method(*args, **kwargs)
        except self._unreachable as exc:
            raise StoreUnreachable(f"ClickHouse at {self._where} cannot be reached: {_cause(exc)}") from exc


# The HTTP libraries' own warnings on a failed attempt (urllib3's "Retrying ...", clickhouse-connect's "Unexpected
# Http Driver Exception") come before our one-line StoreUnreachable and say less: muted during our calls only.
_NOISY = ("urllib3", "clickhouse_connect")
_calls = threading.local()


class _DuringOurCalls(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_calls, "quiet", False)


_MUTE = _DuringOurCalls()


def _mute_libraries() -> None:
    """The filter on each of their loggers (a logger's filter is not its children's): once they are imported."""
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(_NOISY):
            logger = logging.getLogger(name)
            if _MUTE not in logger.filters:
                logger.addFilter(_MUTE)


@contextlib.contextmanager
def _quiet():
    _calls.quiet = True
    try:
        yield
    finally:
        _calls.quiet = False


def _cause(exc: Exception) -> str:
    """What a connection failure comes down to ("[Errno 111] Connection refused" -> "connection refused")."""
    text = str(exc)
    found = re.search(r"\[Errno -?\d+\] ([^\"')]+)", text)
    if found:
        return found.group(1).strip().lower()
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:200]


def _locked(status: Path) -> bool:
    """Whether another process holds ClickHouse's lock on a data directory's `status` file (an exclusive flock)."""
    if not status.exists():
        return False
    with open(status, "rb") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _require(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(f"{what} need the ClickHouse extra: pip install 'kvobs[clickhouse]' ({exc})") from exc


def _arrow_stream(data: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as stream:
        stream.write_table(data)
    return sink.getvalue().to_pybytes()


def _plain(token: str) -> str:
    if not token.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"insert token {token!r}: letters, digits, '-' and '_' only")
    return token


def _chdb_params(params: dict[str, Any] | None) -> dict[str, str] | None:
    """chDB takes parameter values as ClickHouse text (the server's HTTP interface does the same)."""
    return None if params is None else {name: _text(value) for name, value in params.items()}


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_quoted(v) if isinstance(v, str) else _text(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
