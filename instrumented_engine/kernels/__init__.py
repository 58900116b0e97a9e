"""Paged-attention kernels. `select_backend(device)` picks Triton on CUDA and the torch reference
elsewhere; both share one contract (see `reference`)."""

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
    return KernelBackend("torch", store_kv_ref, paged_decode_attention_ref)
