"""Agent sessions, steps and tool calls as spans; recorded into the store by a recorder, or by `kvobs collect`
from the spans alone (an agent then needs only an OTLP endpoint).

    with AgentSession("researcher", recorder=StoreStepRecorder(writer)) as session:   # invoke_agent researcher
        with session.step(deadline_s=30) as step:                                    # agent_step
            reply = step.chat(client, model="smollm2", messages=history, max_tokens=64)  # chat smollm2 -> engine
            with step.tool("search"):                                                # execute_tool search
                result = search(reply.text)

    @tool("search")                       # a decorator: an execute_tool span whenever it runs
    def search(query): ...

A step fails when its body raises (`error.type`: the HTTP status of a failed LLM call, `timeout`, or the
exception's type), when `step.fail(...)` is called (an unparseable reply), or when it outlasts its deadline
(`timeout`); the exception still propagates. Each finished step goes to the recorder and to the
`kvobs_agent_steps` / `kvobs_agent_step_failures` metrics.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from contextvars import Token
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider, get_meter_provider
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider, get_tracer_provider
from opentelemetry.util.types import AttributeValue

from kvobs.agent.chat import ChatError, ChatResult, chat_completion, release_session
from kvobs.agent.tools import CURRENT_STEP, SCOPE, error_type_of, tool_span
from kvobs.semconv import attributes as a
from kvobs.semconv.metrics import LABEL_ERROR_TYPE, LABEL_STATUS, kvobs_metrics
from kvobs.semconv.spans import (
    GenAIOperation,
    SpanName,
    StepErrorType,
    StepStatus,
    invoke_agent_span,
)


class StepRecorder(Protocol):
    """Where a session reports itself and its finished steps (`kvobs.agent.recorder.StoreStepRecorder`)."""

    def session_started(self, session: AgentSession) -> None: ...

    def step_finished(self, session: AgentSession, step: AgentStep) -> None: ...

    def session_ended(self, session: AgentSession) -> None: ...


class AgentSession:
    """One agent conversation: an `invoke_agent {agent}` span around its steps.

    Args:
        agent_name: `gen_ai.agent.name`.
        session_id: `gen_ai.conversation.id` and the `X-Session-ID` every LLM call sends (default: a new uuid).
        parent_session_id: the session that started this one (a subagent's caller), sent as `X-Parent-Session-ID`
            and recorded on the session.
        tracer_provider, meter_provider: where spans and metrics go (default: the global ones).
        recorder: receives sessions and finished steps (`StoreStepRecorder` writes them to the store).
        release_on_exit: when the session ends, tell the LLM server it is done (`kvobs serve` frees the blocks
            only it used and settles its idle losses as after its end; other servers ignore it).
    """

    def __init__(
        self,
        agent_name: str,
        *,
        session_id: str | None = None,
        parent_session_id: str | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        recorder: StepRecorder | None = None,
        release_on_exit: bool = True,
    ) -> None:
        self.agent_name = agent_name
        self.release_on_exit = release_on_exit
        self.client = None  # the LLM client of the latest step's call, for the release
        self.session_id = session_id or f"sess-{uuid.uuid4().hex[:16]}"
        self.parent_session_id = parent_session_id
        self.tracer = (tracer_provider or get_tracer_provider()).get_tracer(SCOPE)
        meter = (meter_provider or get_meter_provider()).get_meter(SCOPE)
        steps, failures = kvobs_metrics.AGENT_STEPS, kvobs_metrics.AGENT_STEP_FAILURES
        self._steps_counter = meter.create_counter(steps.otel_name, steps.otel_unit, steps.description)
        self._failures_counter = meter.create_counter(failures.otel_name, failures.otel_unit, failures.description)
        self.recorder = recorder
        self.num_steps = 0
        self.num_failed_steps = 0
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.span: trace.Span | None = None
        self._token: Token[Context] | None = None

    def __enter__(self) -> AgentSession:
        self.started_at = time.time()
        self.span = self.tracer.start_span(
            invoke_agent_span(self.agent_name),
            kind=SpanKind.INTERNAL,
            attributes={
                a.GEN_AI_OPERATION_NAME: GenAIOperation.INVOKE_AGENT.value,
                a.GEN_AI_AGENT_NAME: self.agent_name,
                a.GEN_AI_CONVERSATION_ID: self.session_id,
                a.AGENT_RECORDED: self.recorder is not None,
                **({a.SESSION_PARENT_ID: self.parent_session_id} if self.parent_session_id else {}),
            },
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        if self.recorder is not None:
            self.recorder.session_started(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.span is not None, "exit before enter"
        self.ended_at = time.time()
        if exc is not None:
            self.span.set_status(Status(StatusCode.ERROR, str(exc)))
            self.span.set_attribute(a.ERROR_TYPE, error_type_of(exc))
        self.span.end()
        if self._token is not None:
            otel_context.detach(self._token)
        if self.recorder is not None:
            self.recorder.session_ended(self)
        if self.release_on_exit and self.client is not None:
            release_session(self.client, self.session_id)

    def step(self, *, deadline_s: float | None = None) -> AgentStep:
        """The next step, a context manager (`with session.step() as step:`)."""
        if self.span is None:
            raise RuntimeError("enter the session (`with AgentSession(...) as session:`) before starting steps")
        step = AgentStep(self, self.num_steps, deadline_s)
        self.num_steps += 1
        return step

    def as_step(self, fn: Callable | None = None, *, deadline_s: float | None = None):
        """Decorator: each call of `fn(step, ...)` runs as the session's next step."""

        def wrap(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def run(*args, **kwargs):
                with self.step(deadline_s=deadline_s) as step:
                    return fn(step, *args, **kwargs)

            return run

        return wrap(fn) if fn is not None else wrap

    def _step_finished(self, step: AgentStep) -> None:
        self.num_failed_steps += step.status is StepStatus.ERROR
        self._steps_counter.add(1, {LABEL_STATUS: step.status.value})
        if step.status is StepStatus.ERROR:
            self._failures_counter.add(1, {LABEL_ERROR_TYPE: step.error_type})
        if self.recorder is not None:
            self.recorder.step_finished(self, step)


class AgentStep:
    """One step: an `agent_step` span holding its LLM calls and tool calls."""

    def __init__(self, session: AgentSession, index: int, deadline_s: float | None) -> None:
        self.session = session
        self.index = index
        self.deadline_s = deadline_s
        self.status = StepStatus.OK
        self.error_type: str | None = None
        self.error_message: str | None = None
        self.started_at = self.ended_at = 0.0
        self.chats: list[ChatResult] = []
        self.tools: list[dict] = []  # its tool calls: name, start, end, status, error_type (`steps.tools`)
        self.span: trace.Span | None = None
        self._start = 0.0
        self._context_token: Token[Context] | None = None  # the OTel context this step attached
        self._step_token: Token | None = None  # the current_step() value it set

    # ---- lifecycle -------------------------------------------------------------------------------------
    def __enter__(self) -> AgentStep:
        self.started_at, self._start = time.time(), time.perf_counter()
        attrs: dict[str, AttributeValue] = {
            a.AGENT_STEP_INDEX: self.index,
            a.GEN_AI_CONVERSATION_ID: self.session.session_id,
            a.AGENT_RECORDED: self.session.recorder is not None,
        }
        if self.deadline_s is not None:
            attrs[a.AGENT_STEP_DEADLINE] = self.deadline_s
        self.span = self.session.tracer.start_span(SpanName.AGENT_STEP, kind=SpanKind.INTERNAL, attributes=attrs)
        self._context_token = otel_context.attach(trace.set_span_in_context(self.span))
        self._step_token = CURRENT_STEP.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.span is not None, "exit before enter"
        self.ended_at = time.time()
        if exc is not None:
            self.fail(error_type_of(exc), str(exc))
        elif self.deadline_s is not None and self.elapsed_s > self.deadline_s:
            self.fail(
                StepErrorType.TIMEOUT.value,
                f"the step took {self.elapsed_s:.2f} s; its deadline is {self.deadline_s:.2f} s",
            )
        if self.status is StepStatus.ERROR:
            self.span.set_status(Status(StatusCode.ERROR, self.error_message))
            self.span.set_attribute(a.ERROR_TYPE, self.error_type)
        self.span.set_attributes(self._record_attributes())
        self.span.end()
        if self._step_token is not None and self._context_token is not None:
            CURRENT_STEP.reset(self._step_token)
            otel_context.detach(self._context_token)
        self.session._step_finished(self)

    def fail(self, error_type: str, message: str | None = None) -> None:
        """Mark the step failed (the first failure is the one recorded)."""
        if self.status is StepStatus.ERROR:
            return
        self.status, self.error_type, self.error_message = StepStatus.ERROR, error_type, message or error_type

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._start

    def remaining_s(self) -> float | None:
        return None if self.deadline_s is None else self.deadline_s - self.elapsed_s

    # ---- inside a step ---------------------------------------------------------------------------------
    def chat(self, client, *, model: str, messages: list[dict], **params) -> ChatResult:
        """An LLM call (see `kvobs.agent.chat`) bounded by what is left of the step's deadline.

        Raises:
            ChatError: the call failed or the deadline had already passed.
        """
        remaining = self.remaining_s()
        if remaining is not None and remaining <= 0:
            raise ChatError(StepErrorType.TIMEOUT.value, "the step's deadline passed before its LLM call")
        self.session.client = client
        result = chat_completion(
            self.session.tracer,
            client,
            model=model,
            messages=messages,
            session_id=self.session.session_id,
            parent_session_id=self.session.parent_session_id,
            timeout_s=remaining,
            step_index=self.index,
            **params,
        )
        self.chats.append(result)
        return result

    @contextmanager
    def tool(self, name: str):
        """An `execute_tool {name}` span: the pause the session's cached prefix must survive; the call is kept on the
        step (`tools`), so its time is the step's own tool time, not time outside the engine."""
        call = {"name": name, "start": time.time(), "end": None, "status": StepStatus.OK.value, "error_type": None}
        self.tools.append(call)
        span = None
        try:
            with tool_span(self.session.tracer, name) as span:
                yield span
        except BaseException as exc:
            call.update(status=StepStatus.ERROR.value, error_type=error_type_of(exc))
            raise
        finally:
            call["end"] = time.time()
            started, ended = getattr(span, "start_time", None), getattr(span, "end_time", None)
            if started and ended:  # the span's own times: what a collector reads from it is the same row
                call.update(start=started / 1e9, end=ended / 1e9)

    def call_tool(self, name: str, fn: Callable, *args, **kwargs):
        with self.tool(name):
            return fn(*args, **kwargs)

    # ---- what the store records ------------------------------------------------------------------------
    @property
    def trace_id(self) -> str:
        assert self.span is not None, "the step has not started"
        return format(self.span.get_span_context().trace_id, "032x")

    @property
    def span_id(self) -> str:
        assert self.span is not None, "the step has not started"
        return format(self.span.get_span_context().span_id, "016x")

    @property
    def ttft_s(self) -> float | None:
        return self.chats[0].ttft_s if self.chats else None

    def _record_attributes(self) -> dict:
        """What the store records of the step, on its span (the collector makes the step of it when no recorder
        writes it): its first call's TTFT and its calls' token totals."""
        values = {
            a.AGENT_STEP_TTFT: self.ttft_s,
            a.GEN_AI_USAGE_INPUT_TOKENS: self.total("prompt_tokens"),
            a.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: self.total("cached_tokens"),
            a.GEN_AI_USAGE_OUTPUT_TOKENS: self.total("completion_tokens"),
        }
        return {key: value for key, value in values.items() if value is not None}

    def total(self, field: str) -> int | None:
        values = [getattr(c, field) for c in self.chats if getattr(c, field) is not None]
        return sum(values) if values else None
