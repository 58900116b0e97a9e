"""The agent session a request names, read the way vLLM reads it and the way coding agents send it (one list of the
ways: `kvobs.semconv.sessions.SESSION_HEADERS`), by `kvobs serve` for every request it takes.

    named = request_session(request.headers, body)   # headers: a case-insensitive mapping (Starlette's, httpx's)
    named.session_id, named.parent_session_id, named.named_by

A subagent of Claude Code shares its conversation's session id and carries its own agent id: it is a session of its
own, `<session>/<agent>`, whose parent is the session (or `<session>/<parent agent>` when a subagent started it), so
its steps and its KV blocks are never mixed with its caller's. An id as sent is returned as sent (the server refuses
one longer than the store's); one made of two is cut to fit as every id is (`kvobs.identifiers.clip_id`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvobs.identifiers import clip_id
from kvobs.semconv.sessions import SESSION_BODY_FIELDS, SESSION_HEADERS


@dataclass(frozen=True)
class NamedSession:
    session_id: str
    parent_session_id: str | None
    named_by: str  # the header or body field it came from


def request_session(headers: Mapping[str, str], body: Mapping | None = None) -> NamedSession | None:
    """The session the request names (None when it names none); an empty value names nothing."""
    for way in SESSION_HEADERS:
        session = headers.get(way.session)
        if not session:
            continue
        agent = headers.get(way.agent) if way.agent else None
        parent = headers.get(way.parent) if way.parent else None
        if way.agent is None:
            return NamedSession(session, parent or None, way.session)
        if not agent or agent == session:  # the main agent of the conversation
            return NamedSession(session, None, way.session)
        caller = session if not parent or parent == session else clip_id(f"{session}/{parent}")
        return NamedSession(clip_id(f"{session}/{agent}"), caller, way.agent)
    for path in SESSION_BODY_FIELDS:
        value = _field(body, path)
        if isinstance(value, str) and value:
            return NamedSession(value, None, ".".join(path))
    return None


def _field(body: Mapping | None, path: tuple[str, ...]):
    for key in path:
        if not isinstance(body, Mapping):
            return None
        body = body.get(key)
    return body
