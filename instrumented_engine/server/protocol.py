"""OpenAI request bodies (with vLLM's extensions) and the OpenAI error shape.

Fields the engine cannot honour (`n` > 1, `logprobs`, `echo`, `best_of`, penalties) are refused with a
400 naming the parameter rather than silently ignored. Unknown fields are ignored, as vLLM does. Chat requests
take `tools`, `tool_choice` and `response_format` (`server/tools.py`, `structured.py`); an assistant message may
carry `tool_calls` and a `tool` message its `tool_call_id`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvobs.identifiers import id_bytes
from kvobs.semconv.limits import MAX_ID_BYTES


class APIError(Exception):
    """An error for the client, rendered as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def check_id(value: str | None, param: str) -> str | None:
    """An identifier from the client (session id, adapter name): at most `MAX_ID_BYTES` UTF-8 bytes, else 400.

    Every store row of a session carries its id, so one long id would be copied a hundred thousand times."""
    if value is not None and id_bytes(value) > MAX_ID_BYTES:
        raise APIError(f"{param} is {id_bytes(value):,} bytes; at most {MAX_ID_BYTES} are allowed", param=param)
    return value


def _id_field(value: str | None, info) -> str | None:
    if value is not None and id_bytes(value) > MAX_ID_BYTES:
        raise ValueError(f"{info.field_name}: {id_bytes(value):,} bytes; at most {MAX_ID_BYTES} are allowed")
    return value


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: Any = None
    session_id: str | None = None  # vLLM accepts the agent session here as well as in X-Session-ID
    vllm_xargs: dict[str, Any] | None = None  # vLLM's extra arguments: its `session_id` names the session too
    user: str | None = None

    _short_ids = field_validator("session_id", "user")(_id_field)

    @model_validator(mode="after")
    def _supported(self) -> _SamplingRequest:
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        if self.presence_penalty or self.frequency_penalty:
            raise ValueError("presence_penalty/frequency_penalty: penalties are not supported; use 0")
        if self.logprobs not in (None, False, 0):
            raise ValueError("logprobs: log probabilities are not supported")
        return self

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str | list):
            if len(value) != 1:
                raise ValueError("prompt: batched prompts are not supported; send one prompt per request")
            value = value[0]
        if not value:
            raise ValueError("prompt: the prompt is empty")
        return value

    @model_validator(mode="after")
    def _no_echo(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo: echoing the prompt is not supported")
        if self.best_of not in (None, 1):
            raise ValueError("best_of: only best_of=1 is supported")
        return self


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Function(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    type: Literal["function"]
    function: Function


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None  # {"name": ..., "schema": {...}, "strict": ...}

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and not isinstance((self.json_schema or {}).get("schema"), dict):
            raise ValueError("response_format: json_schema needs json_schema.schema, a JSON schema object")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # on a tool's result: the call it answers

    def text(self) -> str:
        """The content as one string (text parts joined; other part types refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"messages: only text content parts are supported; got {part.get('type')!r}")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _tool_choice_names_a_tool(self) -> ChatCompletionRequest:
        names = {t.function.name for t in self.tools or ()}
        if self.tool_choice == "required" and not names:
            raise ValueError("tool_choice: 'required' needs tools")
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            if self.tool_choice.get("type") != "function" or name not in names:
                raise ValueError(f"tool_choice: names no tool of this request ({name!r}; tools: {sorted(names)})")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def tool_list(self) -> list[dict]:
        """The request's tools as plain dicts: in the prompt whatever tool_choice says (as vLLM renders them, so
        the prompt's prefix, and its cache, stays the same across turns)."""
        return [t.model_dump(exclude_none=True) for t in self.tools or ()]

    @property
    def callable_tools(self) -> list[dict]:
        """The tools a reply may call (none when tool_choice is 'none')."""
        return [] if self.tool_choice == "none" else self.tool_list

    @property
    def forced_tool(self) -> str | None:
        """The tool a named tool_choice forces."""
        return self.tool_choice["function"]["name"] if isinstance(self.tool_choice, dict) else None

    def conversation(self) -> list[dict[str, Any]]:
        out = []
        for m in self.messages:
            message: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
            if m.tool_calls:
                message["tool_calls"] = [c.model_dump() for c in m.tool_calls]
            if m.tool_call_id is not None:
                message["tool_call_id"] = m.tool_call_id
            out.append(message)
        return out


class InvalidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    session_id: str | None = None
    adapter: str | None = None

    _short_ids = field_validator("reason", "session_id", "adapter")(_id_field)
