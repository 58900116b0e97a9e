"""OpenAI request bodies (with vLLM's extensions) and the OpenAI error shape.

Fields the engine cannot honour (`n` > 1, `logprobs`, `echo`, `best_of`, penalties) are refused with a
400 naming the parameter rather than silently ignored. Unknown fields are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvobs.identifiers import id_bytes
from kvobs.semconv.protocol import MAX_ID_BYTES


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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None

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

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]


class InvalidateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    session_id: str | None = None
    adapter: str | None = None

    _short_ids = field_validator("reason", "session_id", "adapter")(_id_field)
