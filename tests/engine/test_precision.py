"""dtype "auto": bfloat16 where the hardware computes it (a CPU with avx512_bf16 or AMX, a GPU with bf16), float32
otherwise; read off the machine, and said in the startup log with the reason."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from instrumented_engine.engine.precision import choose_dtype, cpu_flags

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"fpu", "avx2", "avx512f", "avx512_bf16"}, "bfloat16"),
        ({"avx2", "amx_tile", "amx_bf16"}, "bfloat16"),
        ({"fpu", "avx2", "avx512f"}, "float32"),  # AVX-512 without its bf16 extension: emulated
        (set(), "float32"),
    ],
)
def test_auto_follows_the_cpu_flags(flags, expected):
    name, why = choose_dtype("auto", CPU, flags=frozenset(flags))
    assert name == expected
    assert ("has avx512_bf16" in why or "has amx_bf16" in why) if expected == "bfloat16" else "emulated" in why


def test_an_explicit_dtype_wins_and_a_gpu_takes_what_it_computes():
    assert choose_dtype("float32", CPU, flags=frozenset({"avx512_bf16"})) == ("float32", "--dtype float32")
    assert choose_dtype("auto", torch.device("cuda"), cuda_bf16=True)[0] == "bfloat16"
    assert choose_dtype("auto", torch.device("cuda"), cuda_bf16=False)[0] == "float16"


def test_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme avx2 avx512_bf16\n\n")
    assert cpu_flags(cpuinfo) == {"fpu", "vme", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_the_engine_says_which_dtype_and_why(make_llm, caplog):
    with caplog.at_level(logging.INFO, logger="instrumented_engine.engine.llm_engine"):
        llm = make_llm(num_blocks=16, max_model_len=128, dtype="auto")
    expected, why = choose_dtype("auto", CPU)
    assert llm.engine.runner.dtype == getattr(torch, expected)
    assert f"computing in {expected} on cpu: {why}" in caplog.text


def test_num_threads_sets_the_compute_threads(make_llm, caplog):
    """`--num-threads N` (EngineConfig.num_threads) is torch's intra-op thread count for the process."""
    from instrumented_engine.commands.engine_flags import add_engine_arguments, engine_config

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config(parser.parse_args(["--num-threads", "1"])).num_threads == 1
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="instrumented_engine.engine.llm_engine"):
            make_llm(num_blocks=16, max_model_len=128, num_threads=1)
        assert torch.get_num_threads() == 1
        assert "1 compute threads" in caplog.text
    finally:
        torch.set_num_threads(before)
