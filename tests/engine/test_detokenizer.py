"""Output text grown token by token (`IncrementalText`) reads exactly as decoding the whole output, on the real
SmolLM2 tokenizer: multi-byte characters split across tokens, leading spaces, special tokens, stop strings."""

from __future__ import annotations

from instrumented_engine import SamplingParams
from instrumented_engine.engine.detokenizer import REPLACEMENT, IncrementalText

TEXTS = ["Café ☕ at 東京 🚀 naïve — done.", "  two  spaces\tand a tab\n\nnew lines", "emoji 👩‍👩‍👧 family, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]


def test_every_step_is_a_prefix_of_the_whole_and_the_end_is_the_whole(smollm2_source):
    tokenizer = smollm2_source.tokenizer
    splits = 0
    for sample in TEXTS:
        ids = tokenizer.encode(sample)
        splits += sum(tokenizer.decode(ids[:k]).endswith(REPLACEMENT) for k in range(1, len(ids)))
        text = IncrementalText(tokenizer)
        for k in range(1, len(ids) + 1):
            so_far, whole = text.extend(ids[:k]), tokenizer.decode(ids[:k])
            assert whole.startswith(so_far), (sample, k)
            if not whole.endswith(REPLACEMENT):
                assert so_far == whole, (sample, k)
        assert text.final(ids) == tokenizer.decode(ids) == sample
    assert splits > 10  # tokens that end inside a character: what the window has to wait out


def test_engine_outputs_read_as_their_tokens(make_llm):
    llm = make_llm(num_blocks=64, max_model_len=256)
    prompts = ["Write a list of three fruits with emoji:", "Translate 'good morning' to Japanese:"]
    for out in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40)):
        assert out.text == llm.tokenizer.decode(out.output_token_ids)
    stopped = llm.generate(["Count: 1, 2, 3,"], SamplingParams(temperature=0, max_tokens=40, stop=[" 6"]))[0]
    whole = llm.tokenizer.decode(stopped.output_token_ids)
    assert stopped.finish_reason == "stop" and " 6" in whole and stopped.text == whole[: whole.find(" 6")]
