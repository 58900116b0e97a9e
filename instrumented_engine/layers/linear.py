"""Linear layers with their weights prepacked once for oneDNN (the CPU's blocked layout), as vLLM's CPU build does.

`torch.nn.functional.linear` on the CPU reorders the weight into oneDNN's blocked layout on every call; for a
decode batch (a few rows against a 576 x 3072 weight) that reorder costs as much as the product. Packed once at
load, a decode step's linears take less time (`bench/engine_throughput.py` measures the whole engine with and
without, `KVOBS_PREPACK=0`). Where oneDNN is absent or cannot pack (a non-x86 build, a GPU,
bfloat16 on a CPU without avx512bw/vl/dq or avx_ne_convert, which oneDNN refuses) the model keeps `nn.Linear`.

    n = prepack_linears(model, batch_hint=16)   # how many nn.Linear were replaced (0: none could be)
"""

from __future__ import annotations

import functools
import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

PREPACK_ENV = "KVOBS_PREPACK"  # "0" keeps nn.Linear (the measured baseline)


class PrepackedLinear(nn.Module):
    """y = x W^T (+ b) with W held in oneDNN's packed layout; the plain weight is not kept."""

    def __init__(self, linear: nn.Linear, batch_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def can_prepack(device: torch.device, dtype: torch.dtype) -> tuple[bool, str]:
    """(whether linears on `device` in `dtype` can be prepacked, why not)."""
    if os.environ.get(PREPACK_ENV, "1") == "0":
        return False, f"{PREPACK_ENV}=0"
    if device.type != "cpu":
        return False, f"weights are prepacked on the CPU only, not on {device.type}"
    if dtype not in (torch.float32, torch.bfloat16):
        return False, f"oneDNN packing is used for float32 and bfloat16, not {dtype}"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False, "this PyTorch build has no oneDNN linear"
    refused = packing_refused(dtype)
    if refused:
        return False, f"oneDNN cannot pack {dtype} on this CPU ({refused})"
    return True, ""


@functools.cache
def packing_refused(dtype: torch.dtype) -> str:
    """Why oneDNN refuses to pack a `dtype` weight on this CPU ("" when it packs one): tried on a small weight, not
    guessed from CPU flags (bfloat16 needs avx512bw/vl/dq or avx_ne_convert, which CPUs of one family may lack)."""
    try:
        with torch.no_grad():
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=dtype), 1)
    except RuntimeError as error:
        return str(error).splitlines()[0]
    return ""


def prepack_linears(model: nn.Module, batch_hint: int) -> int:
    """Replace every `nn.Linear` in `model` by a `PrepackedLinear` (inference only); returns how many were.
    A weight shared with another module (a tied embedding) stays where it is; the packed copy is the linear's."""
    targets = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, PrepackedLinear(module, batch_hint))
    return len(targets)
