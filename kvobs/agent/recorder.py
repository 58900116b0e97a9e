"""Where the agent SDK records sessions and steps: the store (`StoreStepRecorder`) or anything alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kvobs.semconv.spans import SessionSource
from kvobs.store.writer import StoreWriter

if TYPE_CHECKING:
    from kvobs.agent.session import AgentSession, AgentStep


class StepRecorder(Protocol):
    def session_started(self, session: AgentSession) -> None: ...

    def step_finished(self, session: AgentSession, step: AgentStep) -> None: ...

    def session_ended(self, session: AgentSession) -> None: ...


class StoreStepRecorder:
    """Writes `sessions` (source `sdk`) and `steps` rows through a `StoreWriter` (never blocks the agent)."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer

    def session_started(self, session: AgentSession) -> None:
        self.writer.upsert("sessions", {**self._session_row(session), "started_at": session.started_at})

    def step_finished(self, session: AgentSession, step: AgentStep) -> None:
        self.writer.add("steps", {
            "session_id": session.session_id,
            "step_index": step.index,
            "trace_id": step.trace_id,
            "span_id": step.span_id,
            "started_at": step.started_at,
            "ended_at": step.ended_at,
            "status": step.status.value,
            "error_type": step.error_type,
            "ttft_s": step.ttft_s,
            "e2e_s": step.ended_at - step.started_at,
            "prompt_tokens": step.total("prompt_tokens"),
            "cached_tokens": step.total("cached_tokens"),
            "completion_tokens": step.total("completion_tokens"),
        })  # fmt: skip
        self.writer.upsert("sessions", self._session_row(session))

    def session_ended(self, session: AgentSession) -> None:
        self.writer.upsert("sessions", {**self._session_row(session), "ended_at": session.ended_at})

    @staticmethod
    def _session_row(session: AgentSession) -> dict:
        return {
            "session_id": session.session_id,
            "agent_name": session.agent_name,
            "source": SessionSource.SDK.value,
            "num_steps": session.num_steps,
            "num_failed_steps": session.num_failed_steps,
        }
