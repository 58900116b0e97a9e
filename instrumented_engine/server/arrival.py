"""When a request reached the server: stamped as the HTTP side receives it, before its body is read, tokenized or
handed to the engine thread (which takes new requests only between steps: a stamp taken there would hold the time a
long prefill kept it waiting, and that wait would read as time before the server). vLLM keeps its API server apart
from the engine core for the same reason.

    app.add_middleware(ArrivalStamp)      # outermost: the earliest the app sees a request
    arrival_ts(request)                   # epoch seconds
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

_KEY = "kvobs_arrival_ts"


class ArrivalStamp:
    """Pure ASGI middleware: note each HTTP request's arrival in its scope's state."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[_KEY] = time.time()
        await self.app(scope, receive, send)


def arrival_ts(request: Request) -> float | None:
    """The request's arrival stamp (None where no `ArrivalStamp` ran: the engine stamps it when it takes it)."""
    return request.scope.get("state", {}).get(_KEY)
