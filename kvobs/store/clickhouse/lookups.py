"""The collector's lookups (`kvobs.store.lookups`' session ends, step counts and trace sessions) in ClickHouse SQL:
each answers its namesake there on a ClickHouse store (`kvobs.store.backends.per_backend` looks here after
`reads`), keyed by an array parameter, never a pasted list."""

from __future__ import annotations

from collections.abc import Iterable

from kvobs.semconv.spans import StepStatus

_OF_SESSIONS = "WHERE session_id IN {keys:Array(String)}"


def session_ends(store, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, float]:
    frame = store.frame(
        f"SELECT session_id, ended_at FROM sessions FINAL {_OF_SESSIONS} AND ended_at IS NOT NULL",
        {"keys": list(session_ids)},
    )
    return {session_id: float(ended) for session_id, ended in zip(frame["session_id"], frame["ended_at"])}


def session_step_counts(store, session_ids: Iterable[str], *, chunk: int = 500) -> dict[str, tuple[int, int]]:
    frame = store.frame(
        f"SELECT session_id, max(step_index) + 1 AS n, countIf(status = '{StepStatus.ERROR.value}') "
        f"AS failed FROM steps FINAL {_OF_SESSIONS} GROUP BY session_id",
        {"keys": list(session_ids)},
    )
    return {sid: (int(n), int(failed)) for sid, n, failed in zip(frame["session_id"], frame["n"], frame["failed"])}


def trace_sessions(store, trace_ids: Iterable[str], *, chunk: int = 500) -> dict[str, str]:
    sql = "SELECT trace_id, session_id FROM steps FINAL WHERE trace_id IN {keys:Array(String)}"
    return dict(store.frame(sql, {"keys": list(trace_ids)})[["trace_id", "session_id"]].itertuples(index=False))
