"""The C++ CPU decode kernel (built here with torch.utils.cpp_extension, as the install does) against the pure-torch
reference on random block tables: block sizes, GQA ratios, ragged lengths, bf16, a padded table; and the engine
chooses it on the CPU unless told not to."""

from __future__ import annotations

import math

import pytest
import torch

from instrumented_engine.kernels import select_backend
from instrumented_engine.kernels.cpu_kernels import CHOICE_ENV, load_decode
from instrumented_engine.kernels.reference import paged_decode_attention_ref
from tests.kernels.test_paged_attention import random_paged


@pytest.fixture(scope="module")
def decode():
    kernel, why = load_decode()
    assert kernel is not None, why  # CI has a compiler: a kernel that does not build is a failure, not a skip
    return kernel


@pytest.mark.parametrize(
    "block_size,h,kvh,d,lens",
    [
        (16, 9, 3, 64, [1, 17, 40, 100, 301]),  # SmolLM2's shape, GQA 3:1
        (8, 8, 8, 32, [3, 8, 9, 31]),  # no GQA
        (32, 16, 2, 64, [64, 1, 33]),  # GQA 8:1
        (4, 4, 1, 16, [2, 13]),  # MQA, tiny blocks
        (16, 15, 5, 128, [7, 250]),  # wider heads
    ],
)
def test_cpp_decode_equals_the_reference(decode, block_size, h, kvh, d, lens):
    for seed in range(3):  # a new shuffle of blocks each time
        k_cache, v_cache, tables, _ = random_paged(lens, block_size, kvh, d, seed=seed)
        q = torch.randn(len(lens), h, d, generator=torch.Generator().manual_seed(10 + seed))
        seq_lens, scale = torch.tensor(lens), 1 / math.sqrt(d)
        want = paged_decode_attention_ref(q, k_cache, v_cache, tables, seq_lens, scale)
        torch.testing.assert_close(decode(q, k_cache, v_cache, tables, seq_lens, scale), want, rtol=1e-5, atol=1e-5)


def test_cpp_decode_in_bfloat16(decode):
    lens = [5, 30, 129]
    k_cache, v_cache, tables, _ = random_paged(lens, 16, 3, 64, seed=5, dtype=torch.bfloat16)
    q = torch.randn(3, 9, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    want = paged_decode_attention_ref(q, k_cache, v_cache, tables, torch.tensor(lens), 0.125)
    got = decode(q, k_cache, v_cache, tables, torch.tensor(lens), 0.125)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_cpp_decode_reads_only_the_sequence_and_refuses_what_it_cannot_do(decode):
    """Blocks past a sequence's length (the null block 0 of a padded table, garbage in unused rows) change
    nothing; a dtype it does not compute is a clear error."""
    k_cache, v_cache, tables, _ = random_paged([3, 40], 16, 3, 64, seed=8)
    q = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(9))
    before = decode(q, k_cache, v_cache, tables, torch.tensor([3, 40]), 0.125)
    k_cache[0].fill_(1e6)  # the null block, padding the first sequence's table
    v_cache[0].fill_(-1e6)
    assert torch.equal(decode(q, k_cache, v_cache, tables, torch.tensor([3, 40]), 0.125), before)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        decode(q.double(), k_cache.double(), v_cache.double(), tables, torch.tensor([3, 40]), 0.125)


def test_the_cpu_backend_is_the_cpp_kernel_unless_told_otherwise(decode, monkeypatch):
    assert select_backend(torch.device("cpu")).name == "cpp"
    monkeypatch.setenv(CHOICE_ENV, "torch")
    backend = select_backend(torch.device("cpu"))
    assert (
        backend.name == f"torch ({CHOICE_ENV}=torch)" and backend.paged_decode_attention is paged_decode_attention_ref
    )


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_one(decode):
    """A build killed midway leaves torch's `lock` file, and torch's next build waits for it to go, silently, for
    ever (the install hung at its last step this way). A lock older than any build is removed, with a line that
    says so, and the next start loads the kernel; a young lock is only said (its build may be running)."""
    import os
    import subprocess
    import sys
    import time

    from instrumented_engine.kernels.cpu_kernels import build_directory

    load_ops_code = "from instrumented_engine.kernels import cpu_kernels; print(cpu_kernels.load_ops()[1])"
    lock = build_directory() / "lock"
    lock.touch()
    try:
        os.utime(lock, (time.time() - 3600, time.time() - 3600))  # left an hour ago
        done = subprocess.run(
            [sys.executable, "-c", load_ops_code],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0 and done.stdout.strip() == "cpp", done.stderr
        assert f"removed {lock}" in done.stderr and not lock.exists()
        lock.touch()  # a build that may be running now: kept, and said
        from instrumented_engine.kernels.cpu_kernels import clear_stale_lock

        assert not clear_stale_lock(lock) and lock.exists()
    finally:
        lock.unlink(missing_ok=True)


def test_the_build_belongs_to_its_environment(tmp_path):
    """Each Python environment builds into its own prefix, under a name with torch's version and the CPU's vector
    instructions: two checkouts' environments never share (nor rebuild, nor wait on) one build directory."""
    import sys
    from pathlib import Path

    from instrumented_engine.kernels.cpu_kernels import build_directory, build_name

    name = build_name()
    assert torch.backends.cpu.get_cpu_capability().lower() in name
    assert "torch" + torch.__version__.replace(".", "_").replace("+", "_") in name
    here = build_directory()
    assert here.is_relative_to(Path(sys.prefix)) and here.name == name  # this environment's (a venv: writable)
    one, two = build_directory(prefix=str(tmp_path / "a")), build_directory(prefix=str(tmp_path / "b"))
    assert one != two and one.is_dir() and two.is_dir()
    assert one.is_relative_to(tmp_path / "a") and two.is_relative_to(tmp_path / "b")
