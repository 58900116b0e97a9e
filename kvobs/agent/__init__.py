"""The agent SDK: sessions, steps, LLM calls and tools as OpenTelemetry spans, recorded into the store.

See `kvobs.agent.session` for the API.
"""

from kvobs.agent.chat import ChatError, ChatResult  # noqa: F401
from kvobs.agent.recorder import StoreStepRecorder  # noqa: F401
from kvobs.agent.session import AgentSession, AgentStep, StepRecorder  # noqa: F401
from kvobs.agent.tools import current_step, tool  # noqa: F401
