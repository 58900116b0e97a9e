"""Per-request sampling parameters (OpenAI/vLLM meanings)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# Temperatures below this are greedy (vLLM's _SAMPLING_EPS): dividing logits by them overflows to inf and NaN.
SAMPLING_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick the next token and when to stop.

    Args:
        temperature: 0 (or anything below `SAMPLING_EPS`) means greedy; otherwise logits are divided by it.
        top_p: nucleus sampling mass in (0, 1].
        top_k: keep the k most likely tokens; 0 or -1 disables.
        seed: per-request seed; None draws from the engine's generator.
        max_tokens: new tokens to generate at most (>= 1).
        stop_token_ids: token ids that end the sequence (the model's EOS is added unless ignore_eos).
        stop: strings that end the sequence; the matched string is cut from the text.
        ignore_eos: keep generating past EOS until max_tokens.
        constraint: the grammar the output must follow (`instrumented_engine.structured.Constraint`: tool calls,
            JSON); None: free text. It holds the request's grammar state, so each request has its own.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    constraint: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 and finite; got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or positive; got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1; got {self.max_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS
