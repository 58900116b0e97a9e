"""How agent frameworks' traces name an LLM call, a tool call, an agent and a session: the three conventions
kvobs reads steps from, each by its own published names (read from each convention's specification and checked
against what its instrumentation packages emit, `tests/collectors/test_agent_conventions.py`).

- OpenTelemetry GenAI (semantic conventions, status Development; `opentelemetry-semantic-conventions`'
  `gen_ai_attributes`): `gen_ai.operation.name` says what a span is; the keys themselves are in
  `kvobs.semconv.attributes` (the SDK emits them too).
- OpenInference (Arize's specification, `openinference-semantic-conventions`): `openinference.span.kind`;
  `session.id`; `llm.token_count.*`; the reply, with its id, as JSON in `output.value`; a failure as the span's
  `exception` event.
- OpenLLMetry / Traceloop (`opentelemetry-semantic-conventions-ai`): `traceloop.span.kind` on workflow, task,
  agent and tool spans, `llm.request.type` on LLM calls beside `gen_ai.*` keys (prompt and completion tokens
  under their older names), and a session among the association properties, which the SDK copies onto every
  span below as `traceloop.association.properties.<key>`.
"""

from __future__ import annotations

from kvobs.semconv import attributes as a

# ---- OpenTelemetry GenAI: gen_ai.operation.name values -------------------------------------------------------
GENAI_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
GENAI_TOOL_OPERATION = "execute_tool"
GENAI_AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent", "invoke_workflow"})

# ---- OpenInference --------------------------------------------------------------------------------------------
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
OI_LLM, OI_TOOL, OI_AGENT, OI_CHAIN = "LLM", "TOOL", "AGENT", "CHAIN"
OI_SESSION_ID = a.SESSION_ID  # "session.id"
OI_OUTPUT_VALUE = "output.value"  # the reply as the client got it (JSON: its "id" is the response id)
OI_OUTPUT_MIME_TYPE = "output.mime_type"
OI_TOKENS_PROMPT = "llm.token_count.prompt"
OI_TOKENS_COMPLETION = "llm.token_count.completion"
OI_TOKENS_CACHE_READ = "llm.token_count.prompt_details.cache_read"
OI_TOOL_NAME = "tool.name"
OI_AGENT_NAME = "agent.name"

# ---- every convention: where a span names its session, and its cached prompt tokens, first found wins ----------
SESSION_KEYS = (a.SESSION_ID, a.GEN_AI_CONVERSATION_ID)  # OpenInference's and vLLM's, then GenAI's
# The prompt tokens read from the cache, by every name an emitter writes (each counts within the input tokens):
CACHE_READ_KEYS = (
    a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,  # GenAI's registry (semconv 1.37+): OpenLLMetry 0.48+, pydantic-ai
    "gen_ai.usage.cache_read_input_tokens",  # OpenLLMetry's earlier name (still its SpanAttributes), Strands Agents
    "gen_ai.usage.input_tokens.cached",  # Sentry's AI spans, OpenRouter's OTLP broadcast
    "gen_ai.usage.input_cached_tokens",  # LiveKit Agents
    OI_TOKENS_CACHE_READ,
)

# ---- OpenLLMetry (Traceloop) ----------------------------------------------------------------------------------
TRACELOOP_PREFIX = "traceloop."
TRACELOOP_SPAN_KIND = "traceloop.span.kind"
TL_WORKFLOW, TL_TASK, TL_AGENT, TL_TOOL = "workflow", "task", "agent", "tool"
TRACELOOP_ENTITY_NAME = "traceloop.entity.name"
TRACELOOP_ASSOCIATION = "traceloop.association.properties."  # + the property's key
TRACELOOP_SESSION_KEYS = ("session_id", "conversation_id", "thread_id")  # the association properties for a session
LLM_REQUEST_TYPE = "llm.request.type"
TL_LLM_REQUEST_TYPES = frozenset({"chat", "completion"})

# ---- OpenTelemetry's exception event (every convention's failures, where `error.type` is not set) -------------
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
# The HTTP status a wrapped client error's message names, for a framework's own exception class around one: the
# OpenAI client's ("Error code: 400 - ...", `openai._base_client`), kept in the message of whatever wraps it, and
# pydantic-ai's `ModelHTTPError` ("status_code: 400, model_name: ...").
STATUS_IN_MESSAGE = (r"\bError code: (\d{3})\b", r"\bstatus_code: (\d{3})\b")

# The OpenAI Python client's error classes, by the HTTP status each stands for (its README, "Handling errors"):
# an LLM call's failure is stored as the status, as the kvobs SDK stores it, whichever library raised it.
OPENAI_STATUS_ERRORS = {
    "BadRequestError": "400",
    "AuthenticationError": "401",
    "PermissionDeniedError": "403",
    "NotFoundError": "404",
    "ConflictError": "409",
    "UnprocessableEntityError": "422",
    "RateLimitError": "429",
    "InternalServerError": "500",
    # langchain-openai re-raises them as subclasses of its own (langchain_openai/chat_models/base.py, 1.x)
    "OpenAIInvalidRequestError": "400",
    "OpenAIContextOverflowError": "400",
    "OpenAIAuthenticationError": "401",
    "OpenAIPermissionDeniedError": "403",
    "OpenAIModelNotFoundError": "404",
    "OpenAIRateLimitError": "429",
    "OpenAIAPIError": "500",
    # a prompt over the model's context, which OpenAI-compatible servers refuse with 400: Agno's class of this name
    # (agno/exceptions.py, status_code 400 by default; its message is the server's text alone) and LiteLLM's (a
    # BadRequestError)
    "ContextWindowExceededError": "400",
}
