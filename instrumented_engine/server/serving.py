"""`/v1/completions` and `/v1/chat/completions`: prompt -> engine request -> OpenAI response or SSE stream.

Streaming sends one chunk per new piece of text and ends with `data: [DONE]`. Text is held back while
it could still be cut by a stop string or ends inside a multi-byte character, so a streamed answer
always equals the non-streamed one. A client that disconnects aborts its request, which frees its
blocks at once. Tokenizing runs on a worker thread, so one huge prompt never stalls the other endpoints (`/health`
included); text that is not valid Unicode (a lone surrogate escape) is a 400, as is a session id over
`MAX_ID_BYTES`. A request the server aborts because it is shutting down gets 503 (streams end with an error event).
A chat request with tools gets a reply in their call syntax back as `tool_calls` (`finish_reason` `tool_calls`); its
stream sends that reply in one delta at the end, since a call cannot be told from text before it is whole. With
`tool_choice` `required` or a named tool, or a JSON `response_format`, decoding follows a grammar (`structured`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import cast

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from instrumented_engine import structured
from instrumented_engine.config import ContextLengthExceeded, check_context_length
from instrumented_engine.engine.async_engine import AsyncEngine, EngineDeadError, RequestStream
from instrumented_engine.engine.stats import RequestOutput
from instrumented_engine.sampling_params import SamplingParams
from instrumented_engine.server.arrival import arrival_ts
from instrumented_engine.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, check_id
from instrumented_engine.server.responses import Response, event, streamed, usage
from instrumented_engine.server.tools import prompt_messages
from kvobs.named_sessions import request_session
from kvobs.semconv.metrics import FINISHED_ERROR

TRACE_HEADERS = ("traceparent", "tracestate")
REPLACEMENT_CHAR = "\ufffd"


@dataclass
class ServedModel:
    name: str
    max_model_len: int
    created: int
    token_details: bool = True  # usage.prompt_tokens_details (vLLM: only with --enable-prompt-tokens-details)


class TextDeltas:
    """Turn cumulative text into safe-to-send deltas."""

    def __init__(self, stop: Sequence[str]) -> None:
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
        self._grammars: structured.Grammars | None = None  # compiled on the first request that needs a grammar

    # ---- endpoints -----------------------------------------------------------------------------
    async def completions(self, body: CompletionRequest, request: Request):
        if isinstance(body.prompt, list):
            prompt_ids = cast(list[int], body.prompt)  # (its validator made a batch of one into its prompt)
        else:
            prompt_ids = await asyncio.to_thread(self.tokenizer.encode, _unicode(body.prompt, "prompt"))
        return await self._serve(body, request, prompt_ids, body.max_tokens, "cmpl", chat=False)

    async def chat_completions(self, body: ChatCompletionRequest, request: Request):
        tools, takes_tools = body.tool_list, self.tokenizer.template_takes_tools

        def tokenize(conversation: list[dict]) -> list[int]:
            messages = prompt_messages(conversation, tools, template_takes_tools=takes_tools)
            text = self.tokenizer.apply_chat_template(messages, tools=tools if takes_tools else None)
            return self.tokenizer.encode(_unicode(text, "messages"))

        try:
            prompt_ids = await asyncio.to_thread(tokenize, body.conversation())
        except ValueError as exc:
            raise APIError(str(exc), param="messages") from exc
        constraint = await asyncio.to_thread(self._constraint, body)
        return await self._serve(
            body,
            request,
            prompt_ids,
            body.token_limit,
            "chatcmpl",
            chat=True,
            constraint=constraint,
            tools=body.callable_tools,
        )

    def _constraint(self, body: ChatCompletionRequest):
        """The grammar a chat request's output must follow: a tool call when tool_choice requires one (or names
        one), JSON when response_format asks for it; None for free text."""
        tools, fmt = body.callable_tools, body.response_format
        wanted = (tools and (body.tool_choice == "required" or body.forced_tool)) or (fmt and fmt.type != "text")
        if not wanted:
            return None
        if not structured.available():
            raise APIError(
                "tool_choice 'required' or a named tool, and response_format json_object or json_schema, "
                "need constrained decoding: pip install 'kvobs[server]' (xgrammar)",
                param="tool_choice",
            )
        if self._grammars is None:
            self._grammars = structured.Grammars(self.tokenizer)
        grammars = self._grammars
        try:
            if tools and (body.tool_choice == "required" or body.forced_tool):
                return grammars.tool_call(tools, name=body.forced_tool)
            schema = fmt.json_schema if fmt is not None and fmt.type == "json_schema" else None
            return grammars.json(None if schema is None else schema["schema"])
        except Exception as exc:  # xgrammar refuses a schema it cannot compile: the client's to fix
            param = "tools" if tools else "response_format"
            raise APIError(f"{param}: the schema cannot be used for constrained decoding: {exc}", param=param) from exc

    # ---- shared path ---------------------------------------------------------------------------
    async def _serve(
        self,
        body,
        request: Request,
        prompt_ids: list[int],
        max_tokens: int | None,
        prefix: str,
        *,
        chat: bool,
        constraint=None,
        tools: list[dict] | None = None,
    ):
        self._check_model(body.model)
        params = self._sampling_params(body, prompt_ids, max_tokens, constraint)
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        named = request_session(request.headers, {"session_id": body.session_id, "vllm_xargs": body.vllm_xargs})
        session_id = None if named is None else check_id(named.session_id, named.named_by)
        parent_session_id = None if named is None else check_id(named.parent_session_id, named.named_by)
        trace = {k: request.headers[k] for k in TRACE_HEADERS if k in request.headers}
        stream = await self.engine.add_request(
            prompt_ids,
            params,
            request_id=request_id,
            session_id=session_id,
            parent_session_id=parent_session_id,
            trace_headers=trace,
            arrival_ts=arrival_ts(request),
        )
        served = self.served
        response = Response(request_id, served.name, int(time.time()), chat, tools or [], served.token_details)
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

    def _sampling_params(self, body, prompt_ids: list[int], max_tokens: int | None, constraint=None) -> SamplingParams:
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
            constraint=constraint,
        )

    async def _sse(
        self, stream: RequestStream, response: Response, deltas: TextDeltas, include_usage: bool
    ) -> AsyncIterator[str]:
        if response.chat:
            yield event(response.chunk({"role": "assistant", "content": ""}, None))
        final = None
        try:
            async for out in stream:
                final = out
                if response.tools:  # a reply that may be a tool call is sent whole, once it is known which
                    if out.finished:
                        delta, finish_reason = response.reply(out)
                        yield event(response.chunk(streamed(delta), finish_reason))
                    continue
                text = deltas.next(out.text, out.finished)
                if text or out.finished:
                    payload = {"content": text} if response.chat else text
                    yield event(response.chunk(payload if text or not response.chat else {}, out.finish_reason))
        except EngineDeadError as exc:
            yield event(APIError(str(exc), status=503, type="server_error").body())
        if final is not None and final.finish_reason == "abort" and self.engine.draining:
            yield event(_shutting_down(len(final.output_token_ids)).body())
        if final is not None and final.finish_reason == FINISHED_ERROR:
            yield event(_failed_alone(response.id).body())
        if include_usage and final is not None:
            yield event({**response.envelope(chunk=True), "choices": [], "usage": usage(final, response.token_details)})
        yield "data: [DONE]\n\n"


def _unicode(text: str, param: str) -> str:
    """`text` if it can be encoded (JSON allows lone surrogate escapes such as "\\ud800"; no tokenizer does)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise APIError(f"{param}: not valid Unicode text ({exc.reason} at character {exc.start})", param=param) from exc
    return text


def _shutting_down(num_tokens: int) -> APIError:
    return APIError(
        f"the server is shutting down; the request was stopped after {num_tokens} tokens; retry elsewhere",
        status=503,
        type="server_error",
        code="server_shutting_down",
    )


def _failed_alone(request_id: str) -> APIError:
    return APIError(
        f"the engine failed on request {request_id} (its sampling or detokenizing raised; see the "
        "server log); other requests are unaffected",
        status=500,
        type="server_error",
        code="request_failed",
    )


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
        if final is None:  # (the engine ends every stream with a finished output)
            raise RuntimeError(f"request {stream.request_id}: its stream ended without an output")
        return final
    finally:
        watcher.cancel()
