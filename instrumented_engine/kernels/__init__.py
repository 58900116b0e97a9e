"""Paged-attention kernels and the fused elementwise layers. `select_backend(device)` picks Triton on CUDA, the C++
decode kernel and fused layers on the CPU (`cpu_kernels`; the torch reference and `fused.TORCH_OPS` where they
cannot be built); each kind shares one contract with its torch version (see `reference`, `fused`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from instrumented_engine.kernels.fused import TORCH_OPS, FusedOps, cpp_ops
from instrumented_engine.kernels.reference import paged_decode_attention_ref, store_kv_ref


@dataclass(frozen=True)
class KernelBackend:
    name: str
    store_kv: Callable[..., None]
    paged_decode_attention: Callable[..., torch.Tensor]
    ops: FusedOps = TORCH_OPS


def select_backend(device: torch.device) -> KernelBackend:
    if device.type == "cuda":
        from instrumented_engine.kernels.triton_attention import (
            paged_decode_attention_triton,
            store_kv_triton,
        )

        return KernelBackend("triton", store_kv_triton, paged_decode_attention_triton)
    from instrumented_engine.kernels.cpu_kernels import load_ops

    module, why = load_ops()
    if module is None:
        return KernelBackend(f"torch ({why})", store_kv_ref, paged_decode_attention_ref)
    return KernelBackend("cpp", store_kv_ref, module.paged_decode_attention, cpp_ops(module))
