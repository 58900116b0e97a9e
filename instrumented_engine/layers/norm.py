"""RMSNorm, computed in float32 as Hugging Face's Llama does (`kernels/fused.py` computes it; a decoder layer
calls its backend's fused version)."""

from __future__ import annotations

import torch
from torch import nn

from instrumented_engine.kernels.fused import rms_norm_ref


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, hidden)
        return rms_norm_ref(x, self.weight, self.eps)
