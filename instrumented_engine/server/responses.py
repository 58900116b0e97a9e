"""The OpenAI response bodies of `/v1/completions` and `/v1/chat/completions`: a whole reply, a stream chunk, the
usage, and an assistant reply that is a call of an offered tool returned as `tool_calls`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from instrumented_engine.engine.stats import RequestOutput
from instrumented_engine.server.tools import parse_tool_calls


@dataclass
class Response:
    id: str
    model: str
    created: int
    chat: bool
    tools: list[dict]  # the tools offered: a reply in their call syntax is returned as tool_calls
    token_details: bool = True  # usage.prompt_tokens_details (its cached tokens)

    def envelope(self, *, chunk: bool) -> dict:
        kind = "text_completion" if not self.chat else "chat.completion.chunk" if chunk else "chat.completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, delta: dict | str, finish_reason: str | None) -> dict:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        choice.update({"delta": delta} if self.chat else {"text": delta})
        return {**self.envelope(chunk=True), "choices": [choice]}

    def full(self, out: RequestOutput) -> dict:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": out.finish_reason}
        if self.chat:
            choice["message"], choice["finish_reason"] = self.reply(out)
        else:
            choice["text"] = out.text
        return {**self.envelope(chunk=False), "choices": [choice], "usage": usage(out, self.token_details)}

    def reply(self, out: RequestOutput) -> tuple[dict, str | None]:
        """The assistant message and finish reason: `tool_calls` when the reply is a call of an offered tool."""
        calls = None
        if self.tools and out.finish_reason == "stop":
            content, calls = parse_tool_calls(out.text, self.tools)
        if not calls:
            return {"role": "assistant", "content": out.text}, out.finish_reason
        return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def streamed(message: dict) -> dict:
    """A whole reply as one stream delta (tool calls carry their index, as OpenAI's stream does)."""
    delta = {"content": message["content"]}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    return delta


def usage(out: RequestOutput, token_details: bool = True) -> dict:
    """A reply's usage; without `token_details`, as vLLM answers by default: `prompt_tokens_details` null."""
    completion = len(out.output_token_ids)
    # (an answered request was admitted: its cached tokens are known)
    details = {"cached_tokens": out.num_cached_tokens or 0} if token_details else None
    return {
        "prompt_tokens": out.num_prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": out.num_prompt_tokens + completion,
        "prompt_tokens_details": details,
    }


def event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
