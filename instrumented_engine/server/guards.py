"""What guards the server before a handler runs: the request body's size, and the API key of the admin endpoints.

    app.add_middleware(BodyLimit, max_bytes=16 * 2**20)      # 413 beyond it, read or announced
    Depends(api_key_guard("s3cret"))                          # 401 without `Authorization: Bearer s3cret`

A body announced larger than the limit (`Content-Length`) is refused before it is read; a body that grows past it
while being read (chunked) is refused once it does, so a 100 MB body never reaches the JSON parser. Both answers are
OpenAI-shaped 413s. The API key is compared in constant time; vLLM's clients send it as a bearer token.
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from instrumented_engine.server.protocol import APIError
from kvobs.semconv.limits import MAX_REQUEST_BYTES

DEFAULT_MAX_REQUEST_BYTES = MAX_REQUEST_BYTES


class BodyLimit:
    """Pure ASGI middleware: refuse request bodies over `max_bytes` with 413."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        announced = dict(scope["headers"]).get(b"content-length", b"")
        if announced.isdigit() and int(announced) > self.max_bytes:
            return await _too_large(send, self._message(int(announced)))
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:  # FastAPI re-raises an HTTPException from the body read as it is
                    raise StarletteHTTPException(413, self._message(received))
            return message

        await self.app(scope, limited, send)

    def _message(self, size: int) -> str:
        return f"the request body is {size:,}+ bytes; at most {self.max_bytes:,} are accepted (--max-request-bytes)"


async def _too_large(send: Send, message: str) -> None:
    body = json.dumps(APIError(message, status=413).body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def api_key_guard(api_key: str | None):
    """A FastAPI dependency: with a key set, the request must carry `Authorization: Bearer <key>` (else 401)."""

    async def guard(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), api_key.encode()):
            raise APIError(
                "this endpoint needs the server's API key (Authorization: Bearer <key>)",
                status=401,
                type="authentication_error",
                code="invalid_api_key",
            )

    return guard
