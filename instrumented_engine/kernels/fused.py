"""The elementwise layers of a decoder, as plain torch (the oracle, and the path on a GPU or without the C++
build) and as the fused C++ operations of `csrc/fused_cpu.cpp`. Both round as Hugging Face's Llama does: RMSNorm
in float32 then cast, products and sums of bfloat16 tensors rounded to bfloat16 one by one.

    ops = select_ops(torch.device("cpu"))      # FusedOps("cpp", ...) or FusedOps("torch", ...)
    normed = ops.rms_norm(x, weight, eps)
    normed, x = ops.add_rms_norm(x, attn_out, weight, eps)   # x + attn_out, and its RMSNorm
    h = ops.silu_mul(gate_up)                                  # SiLU(gate) * up of [gate | up] rows
    ops.rotary_(qkv, positions, cos_sin, heads, head_dim)      # rotates the first `heads` heads of each row
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_ref(
    x: torch.Tensor, add: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    total = x + add
    return rms_norm_ref(total, weight, eps), total


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def rotary_ref_(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, heads: int, head_dim: int) -> None:
    """Rotate, in place, the first `heads` heads of head_dim in each row of x (T, width) at `positions` (T,)."""
    t = x.shape[0]
    rows = x[:, : heads * head_dim].view(t, heads, head_dim)
    cs = cos_sin[positions]  # (T, 2, D) float32
    cos, sin = cs[:, 0, None, :].to(x.dtype), cs[:, 1, None, :].to(x.dtype)
    half = head_dim // 2
    rotated = torch.cat([-rows[..., half:], rows[..., :half]], dim=-1)
    rows.copy_(rows * cos + rotated * sin)


@dataclass(frozen=True)
class FusedOps:
    name: str
    rms_norm: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    add_rms_norm: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    rotary_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], None]


TORCH_OPS = FusedOps("torch", rms_norm_ref, add_rms_norm_ref, silu_mul_ref, rotary_ref_)


def cpp_ops(module) -> FusedOps:
    def add_rms_norm(x, add, weight, eps):
        normed, total = module.add_rms_norm(x, add, weight, eps)
        return normed, total

    return FusedOps("cpp", module.rms_norm, add_rms_norm, module.silu_mul, module.rotary_)
