"""Request-level behaviour on the real model: sampling controls, stops, aborts, and bad input."""

from __future__ import annotations

import pytest

from instrumented_engine import SamplingParams


@pytest.fixture(scope="module")
def llm(make_llm):
    return make_llm(num_blocks=256, max_model_len=512)


PROMPT = "List three fruits:"


def test_seeded_sampling_is_reproducible_and_seeds_differ(llm):
    sp = lambda seed: SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=seed, max_tokens=24, ignore_eos=True)
    a, b, c = llm.generate([PROMPT, PROMPT, PROMPT], [sp(1), sp(1), sp(2)])
    assert a.output_token_ids == b.output_token_ids
    assert a.output_token_ids != c.output_token_ids


def test_top_k_one_is_greedy(llm):
    greedy, topk = llm.generate(
        [PROMPT, PROMPT],
        [SamplingParams(temperature=0, max_tokens=16), SamplingParams(temperature=0.8, top_k=1, seed=3, max_tokens=16)],
    )
    assert greedy.output_token_ids == topk.output_token_ids


def test_max_tokens_and_ignore_eos(llm):
    (out,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert len(out.output_token_ids) == 40 and out.finish_reason == "length"


def test_stop_token_ids_and_stop_strings(llm):
    (full,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    third = full.output_token_ids[2]
    (by_id,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30, stop_token_ids=(third,)))
    assert by_id.output_token_ids == full.output_token_ids[:3] and by_id.finish_reason == "stop"
    stop = full.text[len(full.text) // 2 :][:3]
    (by_str,) = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=30, stop=(stop,)))
    assert by_str.finish_reason == "stop" and stop not in by_str.text and full.text.startswith(by_str.text)


def test_eos_stops_generation(llm):
    (out,) = llm.chat([[{"role": "user", "content": "Say yes."}]], SamplingParams(temperature=0, max_tokens=200))
    assert out.finish_reason == "stop" and out.output_token_ids[-1] == llm.tokenizer.eos_token_id


def test_abort_frees_blocks(llm):
    engine = llm.engine
    free = engine.block_manager.num_free_blocks
    rid = engine.add_request(PROMPT * 20, SamplingParams(temperature=0, max_tokens=50))
    engine.step()
    assert engine.block_manager.num_free_blocks < free
    assert engine.abort(rid) and not engine.abort(rid)
    assert engine.block_manager.num_free_blocks == free and not engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "prompt,params,message",
    [
        ([100] * 600, SamplingParams(max_tokens=1), r"prompt has 600 tokens; this model's context is 512"),
        ("hello", SamplingParams(max_tokens=600), r"lower max_tokens to at most 511"),
        ("", SamplingParams(), "the prompt is empty"),
        ([1, 99999], SamplingParams(), "outside the vocabulary"),
    ],
)
def test_bad_requests_raise_clear_errors(llm, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        llm.engine.add_request(prompt, params)
    assert not llm.engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_tokens=0), "max_tokens must be at least 1"),
        (dict(temperature=-0.5), "temperature must be >= 0"),
        (dict(temperature=float("nan")), "temperature must be >= 0 and finite"),
        (dict(temperature=float("inf")), "temperature must be >= 0 and finite"),
        (dict(top_p=0), "top_p must be in"),
    ],
)
def test_bad_sampling_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_duplicate_request_id(llm):
    llm.engine.add_request("hi", SamplingParams(max_tokens=1), request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        llm.engine.add_request("hi", SamplingParams(max_tokens=1), request_id="dup")
    llm.engine.abort("dup")
