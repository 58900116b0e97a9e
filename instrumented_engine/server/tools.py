"""Tool calling on `/v1/chat/completions`: the request's `tools`, the history's `tool_calls` and `tool` messages into
the prompt, and the model's tool-call syntax out of the reply, as vLLM's server does with a tool parser.

    conversation = prompt_messages(body.messages, tools, template_takes_tools=False)
    content, calls = parse_tool_calls(text, tools)      # calls: OpenAI `tool_calls`, or None when there are none

The syntax is SmolLM2's (its model card and its Ollama template), which Hermes-style models share: the tools are
listed in the system prompt inside `<tools>...</tools>`, the model answers `<tool_call>[{"name": ..., "arguments":
{...}}]</tool_call>`, an earlier call is shown to it in the same form and a tool's result as a user turn inside
`<tool_response>...</tool_response>`. A chat template that renders tools itself (it names `tools`) gets the
request's tools and the messages as OpenAI shapes them instead. A reply that does not parse as a call of a
requested tool stays text (`finish_reason` stop), never a guessed call.
"""

from __future__ import annotations

import json
import uuid

from instrumented_engine.structured import TOOL_CALL_END, TOOL_CALL_START

TOOLS_PROMPT = """You are an expert in composing functions. You are given a question and a set of possible functions.
Based on the question, you will need to make one or more function/tool calls to achieve the purpose.
If none of the functions can be used, point it out and refuse to answer.
If the given question lacks the parameters required by the function, also point it out.
You have access to the following tools:
<tools>{tools}</tools>
The output MUST strictly adhere to the following format, and NO other text MUST be included.
The example format is as follows. Please make sure the parameter type is correct. If no function call is needed, please make the tool calls an empty list '[]'.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
(more tool calls as required)
]</tool_call>"""  # noqa: E501 (the model card's words, one line each)


def prompt_messages(messages: list[dict], tools: list[dict] | None, *, template_takes_tools: bool) -> list[dict]:
    """The messages the chat template renders. `messages`: OpenAI messages as dicts (role, content, tool_calls,
    tool_call_id); `tools`: the request's tools (None or empty: tool_choice none, or no tools)."""
    if template_takes_tools:
        return messages
    out = []
    if tools:
        listed = json.dumps([t["function"] for t in tools], ensure_ascii=False)
        system = TOOLS_PROMPT.format(tools=listed)
        if messages and messages[0]["role"] == "system":
            system = f"{messages[0]['content']}\n\n{system}"
            messages = messages[1:]
        out.append({"role": "system", "content": system})
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            shown = [
                {"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                for c in m["tool_calls"]
            ]
            text = f"{TOOL_CALL_START}{json.dumps(shown, ensure_ascii=False)}{TOOL_CALL_END}"
            out.append({"role": "assistant", "content": f"{m.get('content') or ''}{text}"})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def parse_tool_calls(text: str, tools: list[dict]) -> tuple[str | None, list[dict] | None]:
    """(content before the call or None, OpenAI `tool_calls`) when `text` holds a call of the requested tools;
    (text, None) otherwise."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, None
    body = text[start + len(TOOL_CALL_START) :]
    end = body.find(TOOL_CALL_END)
    try:
        parsed = json.loads(body[:end] if end >= 0 else body)
    except ValueError:
        return text, None
    names = {t["function"]["name"] for t in tools}
    entries = parsed if isinstance(parsed, list) else [parsed]
    calls = []
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("name") not in names:
            return text, None
        arguments = entry.get("arguments", {})
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": entry["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        )
    if not calls:
        return text, None
    return text[:start].strip() or None, calls


def _arguments(value):
    """A call's arguments as the model wrote them: OpenAI sends them as a JSON string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value if value is not None else {}
