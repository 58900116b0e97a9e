"""instrumented_engine: a paged-KV inference engine whose KV cache is fully visible.

Offline use: `LLM(...).generate(...)`; step-level use: `LLMEngine.add_request/step/abort/invalidate`.
"""

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.llm import LLM
from instrumented_engine.sampling_params import SamplingParams

__all__ = ["LLM", "EngineConfig", "LLMEngine", "SamplingParams"]
