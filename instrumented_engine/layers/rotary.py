"""Rotary position embedding, Hugging Face's rotate_half layout over the full head dim: the cos/sin table. The
rotation itself is `backend.ops.rotary_` (kernels/fused.py), in place on the QKV projection's output."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, base: float) -> None:
        super().__init__()
        self.head_dim, self.max_positions, self.base = head_dim, max_positions, base
        self.register_buffer("cos_sin", torch.empty(0), persistent=False)

    def build(self, device: torch.device) -> None:
        """Precompute cos/sin for every position (float32): (max_positions, 2, head_dim)."""
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(self.max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos_sin = torch.stack([emb.cos(), emb.sin()], dim=1).to(device)
