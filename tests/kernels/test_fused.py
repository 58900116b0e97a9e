"""The fused C++ layers (`csrc/fused_cpu.cpp`) against their torch versions (`kernels/fused.py`, which round as
Hugging Face's Llama does): float32 up to the order of sums, bfloat16 the same numbers but for under 1% that are a
step or two apart, where a float32 sum in another order (or another exp) lands on the other side of a rounding
boundary."""

from __future__ import annotations

import pytest
import torch

from instrumented_engine.kernels import select_backend
from instrumented_engine.kernels.cpu_kernels import load_ops
from instrumented_engine.kernels.fused import TORCH_OPS, cpp_ops
from instrumented_engine.layers.rotary import RotaryEmbedding


@pytest.fixture(scope="module")
def ops():
    module, why = load_ops()
    assert module is not None, why  # CI has a compiler: a build failure is a failure, not a skip
    return cpp_ops(module)


def rand(*shape, dtype, seed, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        return
    differ = got != want
    assert differ.float().mean() < 0.01, f"{int(differ.sum())} of {want.numel()} differ"
    # where they differ, by a bfloat16 step (2^-7 of the value) in an intermediate, so two steps at most
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-6)


DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 16, 300])
def test_rms_norm_and_add_rms_norm(ops, dtype, rows):
    x = rand(rows, 576, dtype=dtype, seed=1, scale=3.0)
    add = rand(rows, 576, dtype=dtype, seed=2)
    w = rand(576, dtype=dtype, seed=3)
    assert_same(ops.rms_norm(x, w, 1e-5), TORCH_OPS.rms_norm(x, w, 1e-5))
    normed, total = ops.add_rms_norm(x, add, w, 1e-5)
    want_normed, want_total = TORCH_OPS.add_rms_norm(x, add, w, 1e-5)
    assert torch.equal(total, want_total)  # one rounded sum per element: exactly torch's
    assert_same(normed, want_normed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(ops, dtype):
    gate_up = rand(37, 2 * 1536, dtype=dtype, seed=4, scale=4.0)
    assert_same(ops.silu_mul(gate_up), TORCH_OPS.silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_in_place_on_the_qkv_rows(ops, dtype):
    """Rotates the query and key heads of each QKV row at its position and leaves the value heads alone."""
    heads, kv_heads, dim = 9, 3, 64
    rotary = RotaryEmbedding(dim, 2048, 100000.0)
    rotary.build(torch.device("cpu"))
    qkv = rand(50, (heads + 2 * kv_heads) * dim, dtype=dtype, seed=5)
    positions = torch.randint(0, 2048, (50,), generator=torch.Generator().manual_seed(6))
    got, want = qkv.clone(), qkv.clone()
    ops.rotary_(got, positions, rotary.cos_sin, heads + kv_heads, dim)
    TORCH_OPS.rotary_(want, positions, rotary.cos_sin, heads + kv_heads, dim)
    assert not torch.equal(want, qkv)
    assert torch.equal(got[:, -kv_heads * dim :], qkv[:, -kv_heads * dim :])
    assert_same(got, want)


def test_bad_inputs_are_clear_errors(ops):
    x = torch.randn(4, 64)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        ops.rms_norm(x.double(), torch.ones(64, dtype=torch.double), 1e-5)
    with pytest.raises(RuntimeError, match="weight must match"):
        ops.rms_norm(x, torch.ones(32), 1e-5)
    with pytest.raises(RuntimeError, match="positions must lie"):
        ops.rotary_(x, torch.tensor([0, 1, 2, 99]), torch.zeros(10, 2, 64), 1, 64)


def test_the_cpu_backend_carries_the_fused_layers_unless_told_not_to(monkeypatch):
    assert select_backend(torch.device("cpu")).ops.name == "cpp"
    monkeypatch.setenv("KVOBS_CPU_KERNEL", "torch")
    assert select_backend(torch.device("cpu")).ops is TORCH_OPS
