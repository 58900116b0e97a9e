"""instrumented_engine: a paged-KV inference engine whose KV cache is fully visible.

Offline use: `LLM(...).generate(...)`; step-level use: `LLMEngine.add_request/step/abort/invalidate`.
The names load lazily, so the tensor-free parts (the block manager, the what-if simulator) import without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LLM": "instrumented_engine.llm",
    "EngineConfig": "instrumented_engine.config",
    "LLMEngine": "instrumented_engine.engine.llm_engine",
    "SamplingParams": "instrumented_engine.sampling_params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'instrumented_engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
