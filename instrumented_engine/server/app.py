"""The FastAPI application: OpenAI endpoints, /health, /metrics, and the KV-cache admin endpoints.

    app = build_app(engine, served, metrics)     # engine: a started AsyncEngine
    app = build_app(engine, served, metrics, api_key="s3cret", max_request_bytes=16 * 2**20)

Routes
    POST /v1/completions, POST /v1/chat/completions   OpenAI-compatible, `stream: true` for SSE
    GET  /v1/models, GET /health, GET /metrics          /health is 503 once the engine loop died
    POST /reset_prefix_cache                            vLLM's name: {"success": bool}
    POST /v1/kvobs/invalidate                           {"reason", "session_id"?, "adapter"?}
    POST /v1/kvobs/sessions/{session_id}/release        drop the blocks only that session used

Every error a client can cause is answered in OpenAI's shape
`{"error": {"message", "type", "param", "code"}}`; 429 when the waiting queue is full, 413 for a body over
`max_request_bytes`. With `api_key` set, the endpoints that change the cache (`/reset_prefix_cache`,
`/v1/kvobs/*`) need `Authorization: Bearer <key>` (401 otherwise).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from instrumented_engine.engine.async_engine import AsyncEngine, EngineDeadError, QueueFullError
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.observers.metrics import CONTENT_TYPE, EngineMetrics
from instrumented_engine.server.arrival import ArrivalStamp
from instrumented_engine.server.guards import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, api_key_guard
from instrumented_engine.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    InvalidateRequest,
    check_id,
)
from instrumented_engine.server.serving import OpenAIServing, ServedModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Served:
    """What the routes serve, kept on `app.state` (routes are module functions, so nothing outside the app holds
    the engine: FastAPI caches its endpoint functions process-wide, and a closure over the engine kept every
    engine built in a process alive, each holding its weights and KV cache)."""

    engine: AsyncEngine
    served: ServedModel
    metrics: EngineMetrics
    serving: OpenAIServing


def build_app(
    engine: AsyncEngine,
    served: ServedModel,
    metrics: EngineMetrics,
    *,
    lifespan=None,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    app = FastAPI(title="kvobs engine", version="0.1.0", lifespan=lifespan)
    app.state.kvobs = _Served(engine, served, metrics, OpenAIServing(engine, served))
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    app.add_middleware(ArrivalStamp)  # added last: the outermost, so the stamp is the earliest
    _install_error_handlers(app)
    app.include_router(_routes)
    app.include_router(_admin_routes, dependencies=[Depends(api_key_guard(api_key))])
    return app


def _served(request: Request) -> _Served:
    return request.app.state.kvobs


_routes = APIRouter()
_admin_routes = APIRouter()  # they change the cache: behind the API key when one is set


@_routes.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    return await _served(request).serving.completions(body, request)


@_routes.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    return await _served(request).serving.chat_completions(body, request)


@_routes.get("/v1/models")
async def models(request: Request):
    s = _served(request)
    card = {
        "id": s.served.name,
        "object": "model",
        "created": s.served.created,
        "owned_by": "kvobs",
        "root": s.engine.engine.model_name,
        "max_model_len": s.served.max_model_len,
    }
    return {"object": "list", "data": [card]}


@_routes.get("/health")
async def health(request: Request):
    engine = _served(request).engine
    if not engine.is_alive:
        raise EngineDeadError(f"the engine loop is not running ({engine.error!r})")
    return Response(status_code=200)


@_routes.get("/metrics")
async def prometheus_metrics(request: Request):
    metrics = _served(request).metrics
    metrics.sync_dropped()
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE)


@_admin_routes.post("/reset_prefix_cache")
async def reset_prefix_cache(request: Request):
    success = await _served(request).engine.call(LLMEngine.reset_prefix_cache)
    return {"success": success}


@_admin_routes.post("/v1/kvobs/invalidate")
async def invalidate(body: InvalidateRequest, request: Request):
    def run(e: LLMEngine):
        return e.invalidate(body.reason, session_id=body.session_id, adapter=body.adapter)

    try:
        event = await _served(request).engine.call(run)
    except ValueError as exc:
        raise APIError(str(exc), param="reason") from exc
    if event is None:
        raise APIError(
            "the prefix cache is in use by running requests; retry when idle", status=409, code="cache_in_use"
        )
    return {
        "success": True,
        "reason": body.reason,
        "kind": event.kind,
        "num_blocks": event.num_blocks,
        "sessions_affected": list(event.sessions_affected),
    }


@_admin_routes.post("/v1/kvobs/sessions/{session_id}/release")
async def release_session(session_id: str, request: Request):
    check_id(session_id, "session_id")
    num_blocks = await _served(request).engine.call(lambda e: e.release_session(session_id))
    return {"session_id": session_id, "num_blocks_released": num_blocks}


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        return JSONResponse(_validation_error(exc).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):
        error_type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        err = APIError(str(exc.detail), status=exc.status_code, type=error_type)
        return JSONResponse(err.body(), status_code=exc.status_code)

    @app.exception_handler(ValueError)
    async def engine_refused(_: Request, exc: ValueError):
        return JSONResponse(APIError(str(exc)).body(), status_code=400)

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError):
        _served(request).metrics.request_rejected()
        err = APIError(str(exc), status=429, type="rate_limit_error", code="queue_full")
        return JSONResponse(err.body(), status_code=429, headers={"retry-after": "1"})

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, exc: EngineDeadError):
        return JSONResponse(APIError(str(exc), status=503, type="server_error").body(), status_code=503)


_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first problem, in the user's terms, naming the parameter."""
    first = exc.errors()[0]
    loc = []
    for part in (str(p) for p in first.get("loc", ()) if p != "body"):
        if part in _UNION_TAGS or "[" in part or part.startswith("function-"):
            break  # pydantic names the union member it tried: not part of the parameter's path
        loc.append(part)
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    if first.get("type") == "json_invalid" or (not loc and first.get("type") in ("model_attributes_type", "dict_type")):
        return APIError(f"We could not parse the JSON body of your request (expected a JSON object): {message}")
    name = ".".join(loc) or None
    param, _, rest = message.partition(": ")
    if rest and (not loc or param == name):  # our validators say "param: message"
        return APIError(rest, param=param)
    if first.get("type") == "missing" and name is None:
        return APIError("the request body is empty; send a JSON object")
    if first.get("type") == "missing":
        return APIError(f"you must provide a {name} parameter", param=name)
    return APIError(f"{name}: {message}" if name else message, param=name)
