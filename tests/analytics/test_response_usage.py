"""Each request's cached tokens as its response said them (its agent step's usage), on the recorded vLLM run: a
step's usage is a request's only where the step sent that one request and both count the same prompt."""

from __future__ import annotations

import pandas as pd

from kvobs.analytics.cache.chains import with_sessions
from kvobs.analytics.steps.attribution import step_requests
from kvobs.analytics.steps.response_usage import RESPONSES, response_cached_tokens, responses_hit_rate


def frames(store) -> tuple[pd.DataFrame, pd.DataFrame]:
    steps = store.reads.steps()
    return with_sessions(store.reads.requests(), steps), steps


def test_each_answered_request_gets_its_steps_cached_tokens(vllm_run):
    requests, steps = frames(vllm_run.store)
    said = response_cached_tokens(requests, steps)
    # 57 steps, one failed before vLLM's answer came (no usage): 56 requests said, one left out
    assert len(steps) == 57 and len(said) == 56
    prompt = dict(zip(requests["request_id"], requests["prompt_tokens"]))
    for step, sent in zip(steps.itertuples(index=False), step_requests(requests, steps)):
        if pd.isna(step.cached_tokens):
            assert step.status == "error"
            continue
        (request_id,) = sent["request_id"]
        assert said[request_id] == step.cached_tokens and prompt[request_id] == step.prompt_tokens
    hit = responses_hit_rate([(r, prompt[r]) for r in said], said)
    assert hit.source == RESPONSES and hit.num_requests == 56
    assert (hit.hit_tokens, hit.query_tokens) == (sum(said.values()), sum(prompt[r] for r in said))


def test_a_usage_of_another_prompt_or_two_disagreeing_steps_say_nothing(vllm_run):
    requests, steps = frames(vllm_run.store)
    answered = steps[steps["cached_tokens"].notna()]
    first, second = answered.index[:2]
    (first_request,) = step_requests(requests, steps.loc[[first]])[0]["request_id"]
    (second_request,) = step_requests(requests, steps.loc[[second]])[0]["request_id"]
    altered = steps.copy()
    altered.loc[first, "prompt_tokens"] += 1  # its usage counts another prompt than its request's
    twice = pd.concat([altered, altered.loc[[second]].assign(cached_tokens=altered.loc[second, "cached_tokens"] + 128)])
    said = response_cached_tokens(requests, twice)
    assert first_request not in said and second_request not in said
    assert len(said) == 54  # the other answered requests keep theirs
    assert response_cached_tokens(requests, steps.iloc[0:0]) == {}
