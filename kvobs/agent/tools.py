"""The SDK's tool calls: an `execute_tool {name}` span around each, the pause a session's cached prefix must survive,
and the step running in this context.

    @tool("search")                       # a decorator: an execute_tool span whenever it runs
    def search(query): ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, get_tracer_provider

from kvobs.agent.chat import ChatError
from kvobs.semconv import attributes as a
from kvobs.semconv.spans import GenAIOperation, StepErrorType, execute_tool_span

SCOPE = "kvobs.agent"
CURRENT_STEP: ContextVar = ContextVar("kvobs_agent_step", default=None)  # the AgentStep running in this context


def current_step():
    """The step running in this context, if any."""
    return CURRENT_STEP.get()


def tool(name: str | None = None):
    """Decorator: run the function inside an `execute_tool {name}` span (default name: the function's)."""

    def wrap(fn: Callable) -> Callable:
        tool_name = name or fn.__name__

        @functools.wraps(fn)
        def run(*args, **kwargs):
            step = current_step()
            if step is not None:  # the step keeps the call (its own tool time)
                with step.tool(tool_name):
                    return fn(*args, **kwargs)
            with tool_span(get_tracer_provider().get_tracer(SCOPE), tool_name):
                return fn(*args, **kwargs)

        return run

    return wrap


@contextmanager
def tool_span(tracer: trace.Tracer, name: str):
    attrs = {a.GEN_AI_OPERATION_NAME: GenAIOperation.EXECUTE_TOOL.value, a.GEN_AI_TOOL_NAME: name}
    with tracer.start_as_current_span(
        execute_tool_span(name),
        kind=SpanKind.INTERNAL,
        attributes=attrs,
        record_exception=True,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except Exception as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.set_attribute(a.ERROR_TYPE, error_type_of(exc))
            raise


def error_type_of(exc: BaseException) -> str:
    if isinstance(exc, ChatError):
        return exc.error_type
    if isinstance(exc, TimeoutError):
        return StepErrorType.TIMEOUT.value
    return type(exc).__qualname__
