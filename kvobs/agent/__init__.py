"""The agent SDK: sessions, steps, LLM calls and tools as OpenTelemetry spans, recorded into the store.

See `kvobs.agent.session` for the API. The names below are loaded on first use, so a command that needs only a small
module of the package (`kvobs.agent.calibrate` for its defaults) does not load the SDK and its store with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvobs.agent.chat import ChatError, ChatResult
    from kvobs.agent.recorder import StoreStepRecorder
    from kvobs.agent.session import AgentSession, AgentStep, StepRecorder
    from kvobs.agent.tools import current_step, tool

_HOMES = {
    "ChatError": "chat",
    "ChatResult": "chat",
    "StoreStepRecorder": "recorder",
    "AgentSession": "session",
    "AgentStep": "session",
    "StepRecorder": "session",
    "current_step": "tools",
    "tool": "tools",
}
__all__ = [
    "AgentSession",
    "AgentStep",
    "ChatError",
    "ChatResult",
    "StepRecorder",
    "StoreStepRecorder",
    "current_step",
    "tool",
]


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module 'kvobs.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvobs.agent.{_HOMES[name]}"), name)
