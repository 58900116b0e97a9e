"""The agent SDK's store recorder: sessions and steps as store records (`StoreStepRecorder`).

The interface a recorder implements (`StepRecorder`) belongs to the session that calls it
(`kvobs.agent.session`); this module depends on the session, never the other way round.
"""

from __future__ import annotations

import json

from kvobs.agent.session import AgentSession, AgentStep
from kvobs.semconv.spans import SessionSource
from kvobs.store.rows import UNSET, SessionRecord, StepRecord
from kvobs.store.writer import StoreWriter


class StoreStepRecorder:
    """Writes `sessions` (source `sdk`) and `steps` rows through a `StoreWriter` (never blocks the agent)."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer

    def session_started(self, session: AgentSession) -> None:
        self.writer.upsert(self._session_record(session, started_at=session.started_at))

    def step_finished(self, session: AgentSession, step: AgentStep) -> None:
        self.writer.add(step_record(session, step))
        self.writer.upsert(self._session_record(session))

    def session_ended(self, session: AgentSession) -> None:
        self.writer.upsert(self._session_record(session, ended_at=session.ended_at))

    @staticmethod
    def _session_record(session: AgentSession, *, started_at=UNSET, ended_at=UNSET) -> SessionRecord:
        return SessionRecord(
            session.session_id,
            agent_name=session.agent_name,
            source=SessionSource.SDK.value,
            num_steps=session.num_steps,
            num_failed_steps=session.num_failed_steps,
            parent_session_id=UNSET if session.parent_session_id is None else session.parent_session_id,
            started_at=started_at,
            ended_at=ended_at,
        )


def step_record(session: AgentSession, step: AgentStep) -> StepRecord:
    """The `steps` row of a finished step (what `kvobs collect` makes of its span when no recorder runs)."""
    return StepRecord(
        session_id=session.session_id,
        step_index=step.index,
        trace_id=step.trace_id,
        span_id=step.span_id,
        started_at=step.started_at,
        ended_at=step.ended_at,
        status=step.status.value,
        error_type=step.error_type,
        ttft_s=step.ttft_s,
        e2e_s=step.ended_at - step.started_at,
        prompt_tokens=step.total("prompt_tokens"),
        cached_tokens=step.total("cached_tokens"),
        completion_tokens=step.total("completion_tokens"),
        tools=json.dumps(step.tools) if step.tools else None,
    )
