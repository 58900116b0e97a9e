"""`/v1/completions` and `/v1/chat/completions`: prompt -> engine request -> OpenAI response or SSE stream.

Streaming sends one chunk per new piece of text and ends with `data: [DONE]`. Text is held back while
it could still be cut by a stop string or ends inside a multi-byte character, so a streamed answer
always equals the non-streamed one. A client that disconnects aborts its request, which frees its
blocks at once. Tokenizing runs on a worker thread, so one huge prompt never stalls the other endpoints (`/health`
included); text that is not valid Unicode (a lone surrogate escape) is a 400, as is a session id over
`MAX_ID_BYTES`. A request the server aborts because it is shutting down gets 503 (streams end with an error event).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from instrumented_engine.config import ContextLengthExceeded, check_context_length
from instrumented_engine.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
from instrumented_engine.engine.stats import RequestOutput
from instrumented_engine.sampling_params import SamplingParams
from instrumented_engine.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, check_id
from kvobs.semconv.metrics import FINISHED_ERROR
from kvobs.semconv.protocol import SESSION_ID_HEADER

TRACE_HEADERS = ("traceparent", "tracestate")
REPLACEMENT_CHAR = "\ufffd"


@dataclass
class ServedModel:
    name: str
    max_model_len: int
    created: int


class TextDeltas:
    """Turn cumulative text into safe-to-send deltas."""

    def __init__(self, stop: list[str]) -> None:
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.sent = 0

    def next(self, text: str, finished: bool) -> str:
        end = len(text) if finished else max(self.sent, len(text) - self.holdback)
        if not finished:
            while end > self.sent and text[end - 1] == REPLACEMENT_CHAR:
                end -= 1  # an incomplete UTF-8 sequence: wait for its next byte
        delta, self.sent = text[self.sent : end], max(self.sent, end)
        return delta


class OpenAIServing:
    """Handlers shared by both endpoints.

    Args:
        engine: the running `AsyncEngine`.
        served: the served model's name and limits.
    """

    def __init__(self, engine: AsyncEngine, served: ServedModel) -> None:
        self.engine = engine
        self.served = served
        self.tokenizer = engine.engine.tokenizer

    # ---- endpoints -----------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        if isinstance(body.prompt, list):
            prompt_ids = body.prompt
        else:
            prompt_ids = await asyncio.to_thread(self.tokenizer.encode, _unicode(body.prompt, "prompt"))
        return await self._serve(body, request, prompt_ids, body.max_tokens, "cmpl", chat=False)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        def tokenize(conversation: list[dict[str, str]]) -> list[int]:
            return self.tokenizer.encode(_unicode(self.tokenizer.apply_chat_template(conversation), "messages"))

        try:
            prompt_ids = await asyncio.to_thread(tokenize, body.conversation())
        except ValueError as exc:
            raise APIError(str(exc), param="messages") from exc
        return await self._serve(body, request, prompt_ids, body.token_limit, "chatcmpl", chat=True)

    # ---- shared path ---------------------------------------------------------------------------
    async def _serve(self, body, request: Request, prompt_ids: list[int], max_tokens: int | None, prefix: str, *,
                     chat: bool):  # fmt: skip
        self._check_model(body.model)
        params = self._sampling_params(body, prompt_ids, max_tokens)
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        session_id = check_id(request.headers.get(SESSION_ID_HEADER), SESSION_ID_HEADER) or body.session_id
        trace = {k: request.headers[k] for k in TRACE_HEADERS if k in request.headers}
        stream = await self.engine.add_request(
            prompt_ids, params, request_id=request_id, session_id=session_id, trace_headers=trace
        )
        response = _Response(request_id, self.served.name, int(time.time()), chat)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self._sse(stream, response, TextDeltas(params.stop), include_usage),
                media_type="text/event-stream",
                headers={"x-request-id": request_id},
            )
        final = await _until_finished(stream, request)
        if final.finish_reason == "abort" and self.engine.draining:
            raise _shutting_down(len(final.output_token_ids))
        if final.finish_reason == FINISHED_ERROR:
            raise _failed_alone(request_id)
        return JSONResponse(response.full(final), headers={"x-request-id": request_id})

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.served.name:
            raise APIError(
                f"The model `{model}` does not exist; this server serves `{self.served.name}`",
                status=404,
                param="model",
                code="model_not_found",
            )

    def _sampling_params(self, body, prompt_ids: list[int], max_tokens: int | None) -> SamplingParams:
        limit = self.served.max_model_len
        if max_tokens is None:
            max_tokens = max(limit - len(prompt_ids), 1)
        try:
            check_context_length(len(prompt_ids), max_tokens, limit)
        except ContextLengthExceeded as exc:  # the engine's check, in the OpenAI API's words
            message = f"This model's maximum context length is {limit:,} tokens; the prompt has {len(prompt_ids):,}"
            if exc.param == "max_tokens":
                message += f" and max_tokens is {max_tokens:,}; lower max_tokens to at most {limit - len(prompt_ids):,}"
            prompt_param = "messages" if isinstance(body, ChatCompletionRequest) else "prompt"
            param = prompt_param if exc.param == "prompt" else "max_tokens"
            raise APIError(message, param=param, code="context_length_exceeded") from exc
        return SamplingParams(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            max_tokens=max_tokens,
            stop=tuple(body.stop_list),
            stop_token_ids=tuple(body.stop_token_ids or ()),
            ignore_eos=body.ignore_eos,
        )

    async def _sse(
        self, stream: RequestStream, response: _Response, deltas: TextDeltas, include_usage: bool
    ) -> AsyncIterator[str]:
        if response.chat:
            yield _event(response.chunk({"role": "assistant", "content": ""}, None))
        final = None
        try:
            async for out in stream:
                text = deltas.next(out.text, out.finished)
                if text or out.finished:
                    payload = {"content": text} if response.chat else text
                    yield _event(response.chunk(payload if text or not response.chat else {}, out.finish_reason))
                final = out
        except EngineDeadError as exc:
            yield _event(APIError(str(exc), status=503, type="server_error").body())
        if final is not None and final.finish_reason == "abort" and self.engine.draining:
            yield _event(_shutting_down(len(final.output_token_ids)).body())
        if final is not None and final.finish_reason == FINISHED_ERROR:
            yield _event(_failed_alone(response.id).body())
        if include_usage and final is not None:
            yield _event({**response.envelope(chunk=True), "choices": [], "usage": _usage(final)})
        yield "data: [DONE]\n\n"


@dataclass
class _Response:
    id: str
    model: str
    created: int
    chat: bool

    def envelope(self, *, chunk: bool) -> dict:
        kind = "text_completion" if not self.chat else "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, delta: dict | str, finish_reason: str | None) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        return {**self.envelope(chunk=True), "choices": [choice]}

    def full(self, out: RequestOutput) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": out.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": out.text}
        else:
            choice["text"] = out.text
        return {**self.envelope(chunk=False), "choices": [choice], "usage": _usage(out)}


def _usage(out: RequestOutput) -> dict:
    completion = len(out.output_token_ids)
    return {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": out.num_prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


def _unicode(text: str, param: str) -> str:
    """`text` if it can be encoded (JSON allows lone surrogate escapes such as "\\ud800"; no tokenizer does)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{param}: not valid Unicode text ({exc.reason} at character {exc.start})", param=param) from exc
    return text


def _shutting_down(num_tokens: int) -> APIError:
    return APIError(f"the server is shutting down; the request was stopped after {num_tokens} tokens; retry "
                    "elsewhere", status=503, type="server_error", code="server_shutting_down")  # fmt: skip


def _failed_alone(request_id: str) -> APIError:
    return APIError(f"the engine failed on request {request_id} (its sampling or detokenizing raised; see the "
                    "server log); other requests are unaffected", status=500, type="server_error",
                    code="request_failed")  # fmt: skip


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _until_finished(stream: RequestStream, request: Request) -> RequestOutput:
    """Wait for the final output; abort the request if the client disconnects first."""

    async def watch_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        stream.abort()

    watcher = asyncio.create_task(watch_disconnect())
    try:
        final = None
        async for out in stream:
            final = out
        return final
    finally:
        watcher.cancel()
