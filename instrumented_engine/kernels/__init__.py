"""Paged-attention kernels. `select_backend(device)` picks Triton on CUDA, the C++ decode kernel on the CPU
(`cpu_kernels`; the torch reference where it cannot be built); all share one contract (see `reference`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from instrumented_engine.kernels.reference import paged_decode_attention_ref, store_kv_ref


@dataclass(frozen=True)
class KernelBackend:
    name: str
    store_kv: Callable[..., None]
    paged_decode_attention: Callable[..., torch.Tensor]


def select_backend(device: torch.device) -> KernelBackend:
    if device.type == "cuda":
        from instrumented_engine.kernels.triton_attention import (
            paged_decode_attention_triton,
            store_kv_triton,
        )

        return KernelBackend("triton", store_kv_triton, paged_decode_attention_triton)
    from instrumented_engine.kernels.cpu_kernels import load_decode

    decode, why = load_decode()
    if decode is None:
        return KernelBackend(f"torch ({why})", store_kv_ref, paged_decode_attention_ref)
    return KernelBackend("cpp", store_kv_ref, decode)
