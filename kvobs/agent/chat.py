"""One LLM call as a `chat {model}` CLIENT span that carries its trace context to the server.

The call always streams (`stream_options.include_usage`), so the time to first token is measured where the agent
feels it. A `timeout_s` is a deadline for the whole call: at it the connection is closed (the server sees the client
go and, as vLLM and `kvobs serve` do, aborts the request and frees its blocks) and the call raises
`ChatError("timeout")` then, not when the reply would have ended. `traceparent`/`tracestate` (W3C) and
`X-Session-ID` go in the request headers; an instrumented engine or vLLM makes its `llm_request` span a child of
this one. Works with the official `openai` client (`OpenAI(base_url=...)`) and with an `httpx.Client` whose
`base_url` is the API root (`.../v1`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.trace import SpanKind, Status, StatusCode

from kvobs.semconv import attributes as a
from kvobs.semconv.sessions import PARENT_SESSION_HEADER, SESSION_ID_HEADER
from kvobs.semconv.spans import GenAIOperation, StepErrorType, chat_span


class ChatError(RuntimeError):
    """An LLM call failed; `error_type` is what goes into `error.type` (HTTP status, `timeout`, exception name)."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True)
class ChatResult:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    e2e_s: float
    response_id: str | None


def chat_completion(
    tracer: trace.Tracer,
    client,
    *,
    model: str,
    messages: list[dict],
    session_id: str | None,
    parent_session_id: str | None = None,
    timeout_s: float | None = None,
    step_index: int | None = None,
    **params,
) -> ChatResult:
    """POST a streaming chat completion inside a `chat {model}` span (`step_index`: the SDK step it belongs to, on
    the span, so the collector counts it in that step and never as a step of its own).

    Raises:
        ChatError: HTTP error status (`error_type` = the code), timeout, connection failure, or a broken stream.
        TypeError: `client` is neither an `openai.OpenAI` nor an `httpx.Client`.
    """
    base_url = str(getattr(client, "base_url", ""))
    attributes = {
        a.GEN_AI_OPERATION_NAME: GenAIOperation.CHAT.value,
        a.GEN_AI_REQUEST_MODEL: model,
        **_server_attributes(base_url),
    }
    if session_id is not None:
        attributes[a.GEN_AI_CONVERSATION_ID] = session_id
    if step_index is not None:
        attributes[a.AGENT_STEP_INDEX] = step_index
    for key, name in ((a.GEN_AI_REQUEST_MAX_TOKENS, "max_tokens"), (a.GEN_AI_REQUEST_TEMPERATURE, "temperature")):
        if params.get(name) is not None:
            attributes[key] = params[name]
    with tracer.start_as_current_span(
        chat_span(model),
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        headers: dict[str, str] = {}
        inject(headers)  # traceparent of this span
        if session_id is not None:
            headers[SESSION_ID_HEADER] = session_id
        if parent_session_id is not None:
            headers[PARENT_SESSION_HEADER] = parent_session_id
        body = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **params,
        }
        start = time.perf_counter()
        try:
            chunks = _stream(client, body, headers, timeout_s)
            result = _collect(chunks, start)
        except ChatError as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.set_attribute(a.ERROR_TYPE, exc.error_type)
            raise
        span.set_attributes(_usage_attributes(result))
        return result


RELEASE_PATH = "kvobs/sessions/{session_id}/release"  # under the OpenAI base URL (/v1/): `kvobs serve` only


def release_session(client, session_id: str, *, timeout_s: float = 5.0) -> bool:
    """Tell the server the session is done (`POST /v1/kvobs/sessions/{id}/release`): its exclusive cached blocks
    are freed and what it lost while idle since its last request is known to be lost after its end, not in a tool
    pause. True when the server took it; a server without the endpoint (vLLM: 404) or an error is False, never
    raised: the session is over either way."""
    url = str(getattr(client, "base_url", "")).rstrip("/") + "/" + RELEASE_PATH.format(session_id=session_id)
    try:
        if isinstance(client, httpx.Client):
            response = client.post(url, timeout=timeout_s)
        else:
            response = httpx.post(url, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return response.is_success


def _server_attributes(base_url: str) -> dict:
    parsed = urlparse(base_url)
    if not parsed.hostname:
        return {}
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return {a.SERVER_ADDRESS: parsed.hostname, a.SERVER_PORT: port}


def _usage_attributes(result: ChatResult) -> dict:
    attrs: dict[str, object] = {a.GEN_AI_RESPONSE_FINISH_REASONS: [result.finish_reason or "unknown"]}
    for key, value in (
        (a.GEN_AI_USAGE_INPUT_TOKENS, result.prompt_tokens),
        (a.GEN_AI_USAGE_OUTPUT_TOKENS, result.completion_tokens),
        (a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, result.cached_tokens),
        (a.GEN_AI_RESPONSE_ID, result.response_id),
    ):
        if value is not None:
            attrs[key] = value
    return attrs


# ---- transports: each yields the stream's chunks as dicts ----------------------------------------------
def _stream(client, body: dict, headers: dict[str, str], timeout_s: float | None):
    if isinstance(client, httpx.Client):
        return _stream_httpx(client, body, headers, timeout_s)
    if hasattr(client, "chat") and hasattr(client.chat, "completions"):
        return _stream_openai(client, body, headers, timeout_s)
    raise TypeError(f"chat needs an openai.OpenAI or an httpx.Client; got {type(client).__name__}")


class Deadline:
    """A call's deadline (`timeout_s` from now; None: none). Once the reply's headers are in, `cut_at_deadline`
    shuts its connection down when the deadline comes: a read blocked in this thread returns at once, and the
    server sees the client leave."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.at = None if timeout_s is None else time.monotonic() + timeout_s
        self.fired = False

    @contextlib.contextmanager
    def cut_at_deadline(self, response: httpx.Response):
        if self.at is None:
            yield
            return
        timer = threading.Timer(max(self.at - time.monotonic(), 0.0), self._cut, args=(response,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def _cut(self, response: httpx.Response) -> None:
        self.fired = True
        stream = response.extensions.get("network_stream")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if sock is None:  # a transport without a socket (in-process): closing is all there is
            response.close()
            return
        with contextlib.suppress(OSError):  # closed meanwhile
            sock.shutdown(socket.SHUT_RDWR)

    def error(self) -> ChatError:
        return ChatError(
            StepErrorType.TIMEOUT.value,
            f"the LLM call passed its {self.timeout_s:.2f} s deadline; the connection was closed, so the server "
            "stops the request",
        )


def _stream_httpx(client: httpx.Client, body: dict, headers: dict[str, str], timeout_s: float | None):
    deadline = Deadline(timeout_s)
    timeout = timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT  # until the headers come
    try:
        with client.stream("POST", "chat/completions", json=body, headers=headers, timeout=timeout) as response:
            if response.status_code >= 400:
                response.read()
                raise ChatError(str(response.status_code), f"HTTP {response.status_code}: {response.text[:500]}")
            with deadline.cut_at_deadline(response):
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    yield _chunk(data)
            if deadline.fired:  # cut between two chunks: the stream ended without its [DONE]
                raise deadline.error()
    except httpx.TimeoutException as exc:
        raise ChatError(StepErrorType.TIMEOUT.value, f"the LLM call timed out: {exc!r}") from exc
    except httpx.HTTPError as exc:
        if deadline.fired:
            raise deadline.error() from exc
        raise ChatError(type(exc).__name__, f"the LLM call failed: {exc!r}") from exc


def _stream_openai(client, body: dict, headers: dict[str, str], timeout_s: float | None):
    import openai

    kwargs = {k: v for k, v in body.items() if k not in ("model", "messages", "stream", "stream_options")}
    known = {"max_tokens", "temperature", "top_p", "stop", "seed", "n", "response_format", "max_completion_tokens"}
    extra_body = {k: kwargs.pop(k) for k in list(kwargs) if k not in known}
    deadline = Deadline(timeout_s)
    try:
        stream = client.chat.completions.create(
            model=body["model"],
            messages=body["messages"],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
            extra_body=extra_body or None,
            timeout=timeout_s,
            **kwargs,
        )
        with deadline.cut_at_deadline(stream.response):
            for chunk in stream:
                yield chunk.model_dump()
        if deadline.fired:
            raise deadline.error()
    except openai.APITimeoutError as exc:
        raise ChatError(StepErrorType.TIMEOUT.value, f"the LLM call timed out: {exc}") from exc
    except openai.APIStatusError as exc:
        raise ChatError(str(exc.status_code), f"HTTP {exc.status_code}: {exc.message}") from exc
    except (openai.APIError, httpx.HTTPError) as exc:
        if deadline.fired:
            raise deadline.error() from exc
        raise ChatError(type(exc).__name__, f"the LLM call failed: {exc}") from exc


def _chunk(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ChatError("invalid_stream", f"the server sent a chunk that is not JSON: {data[:200]!r}") from exc
    if "error" in chunk:  # an error reported inside the stream
        error = chunk["error"]
        code = error.get("code") if isinstance(error, dict) else None
        raise ChatError(str(code or "stream_error"), f"the server reported an error mid-stream: {error}")
    return chunk


def _collect(chunks, start: float) -> ChatResult:
    parts: list[str] = []
    ttft = None
    finish_reason = response_id = usage = None
    for chunk in chunks:
        response_id = response_id or chunk.get("id")
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                if ttft is None:
                    ttft = time.perf_counter() - start
                parts.append(content)
            finish_reason = choice.get("finish_reason") or finish_reason
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return ChatResult(
        text="".join(parts),
        finish_reason=finish_reason,
        prompt_tokens=usage.get("prompt_tokens"),
        cached_tokens=details.get("cached_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        ttft_s=ttft,
        e2e_s=time.perf_counter() - start,
        response_id=response_id,
    )
