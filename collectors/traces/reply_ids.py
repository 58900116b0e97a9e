"""The ids a reply recorded on an LLM call's span may hold: candidates for the server request it answered.

    reply_ids('{"generations": [[{"message": {"kwargs": {"response_metadata": {"id": "chatcmpl-1"}}}}]]}')
    # -> ("chatcmpl-1",)

OpenInference keeps the reply as the instrumented library returned it, serialized to JSON in `output.value`, so
the server's id sits where each library keeps it. Read in recorded spans (`tests/fixtures/agents/`):
- the OpenAI client (`openinference-instrumentation-openai`): the ChatCompletion itself, `id` at the top;
- LangChain (`openinference-instrumentation-langchain`, the run's outputs): an `LLMResult`, the id in
  `generations[i][j].message.kwargs.response_metadata.id` and `llm_output.id`; the message's own `kwargs.id` is
  LangChain's run id (`lc_run--...`), never the server's;
- the OpenAI Agents SDK on a chat-completions model keeps no id there (its generation span holds the messages),
  nor, by its source, does smolagents (`ChatMessage.model_dump_json` leaves its `raw` reply out): those calls join
  otherwise.
Rather than one path per library, every string under a key `id` or `response_id` is a candidate, in document
order, up to `MAX_IDS`, but for those inside a reply's tool calls (`TOOL_CALL_KEYS`: their `call_...` ids are the
calls', never the server's, and a step that kept one as its reply id named a request nobody sent): a candidate is
only ever taken when it is the id of a request the collector saw on an instance inside the call's time window
(`collectors/traces/request_join.py`), so a run id that no server request has is never joined. OTel GenAI writes the
id itself (`gen_ai.response.id`).
"""

from __future__ import annotations

import json

from kvobs.identifiers import clip_id

ID_KEYS = frozenset({"id", "response_id"})
# a reply's tool calls carry ids of their own (`call_...`): never a server request's, so never walked into
TOOL_CALL_KEYS = frozenset({"tool_calls", "tool_call_chunks", "invalid_tool_calls"})
MAX_IDS = 16  # a reply with more ids than this is a long conversation's history: its first ones are the reply's
MAX_DEPTH = 12


def reply_ids(output) -> tuple[str, ...]:
    """Candidate ids in a reply kept as JSON (`output.value`); none when it is not JSON."""
    if not isinstance(output, str) or not output.lstrip().startswith(("{", "[")):
        return ()
    try:
        reply = json.loads(output)
    except ValueError:
        return ()
    found: dict[str, None] = {}
    _walk(reply, found, 0)
    return tuple(found)


def _walk(node, found: dict[str, None], depth: int) -> None:
    if len(found) >= MAX_IDS or depth > MAX_DEPTH:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_KEYS and isinstance(value, str) and value:
                found.setdefault(clip_id(value), None)
                if len(found) >= MAX_IDS:
                    return
        for key, value in node.items():
            if isinstance(value, dict | list) and key not in TOOL_CALL_KEYS:
                _walk(value, found, depth + 1)
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, dict | list):
                _walk(value, found, depth + 1)
