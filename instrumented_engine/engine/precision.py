"""Which dtype the engine computes in when asked for "auto": bfloat16 where the hardware computes it natively,
float32 otherwise. Detected on the machine, never assumed: CPUs of one kind differ (one with `avx512_bf16` runs bf16
linears faster than fp32; one with only AVX2 emulates bf16 and is slower: the figures are in this module's commits).

    name, why = choose_dtype("auto", torch.device("cpu"))    # ("bfloat16", "the CPU has avx512_bf16") or ...
"""

from __future__ import annotations

from pathlib import Path

import torch

BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of native bf16 arithmetic (x86)
CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags (Linux x86 `/proc/cpuinfo`); empty where there is no such file."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def choose_dtype(
    requested: str, device: torch.device, *, flags: frozenset[str] | None = None, cuda_bf16: bool | None = None
) -> tuple[str, str]:
    """(dtype name, why) for `requested` ("auto" or a dtype name) on `device`."""
    if requested != "auto":
        return requested, f"--dtype {requested}"
    if device.type == "cuda":
        if cuda_bf16 if cuda_bf16 is not None else torch.cuda.is_bf16_supported():
            return "bfloat16", "the GPU computes bfloat16"
        return "float16", "the GPU has no bfloat16"
    native = sorted(set(BF16_CPU_FLAGS) & (cpu_flags() if flags is None else flags))
    if native:
        return "bfloat16", f"the CPU has {' and '.join(native)}"
    return "float32", "the CPU has no avx512_bf16 or AMX, so bfloat16 would be emulated (slower than float32)"
