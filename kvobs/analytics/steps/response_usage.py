"""The cached prompt tokens each request's response said, as the agent step that sent it recorded them (OpenAI's
`usage.prompt_tokens_details.cached_tokens`): the engine's own count for exactly that request, where vLLM's spans and
counters give none per request.

    said = response_cached_tokens(requests, steps)           # request id -> cached tokens its response said
    hit = responses_hit_rate([(rid, prompt), ...], said)     # the hit rate of exactly those requests

A step's usage is a request's only where the step sent that one request (the attribution's matching) and both say
the same prompt tokens: a step that sent two (a retry) or whose usage counts another prompt is no request's.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from kvobs.analytics.cache import HitRate
from kvobs.analytics.steps.attribution import step_requests
from kvobs.analytics.steps.facts import missing

RESPONSES = "responses"  # `HitRate.source`: the requests' responses' usage, as their steps recorded it


def response_cached_tokens(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, int]:
    """request id -> the cached prompt tokens its response said; requests no step speaks for are left out, and so
    is one two steps disagree on."""
    if requests.empty or steps.empty:
        return {}
    said: dict[str, int] = {}
    disputed: set[str] = set()
    for step, sent in zip(steps.itertuples(index=False), step_requests(requests, steps)):
        if len(sent) != 1 or missing(step.cached_tokens) or missing(step.prompt_tokens):
            continue
        request = sent.iloc[0]
        if missing(request["prompt_tokens"]) or int(step.prompt_tokens) != int(request["prompt_tokens"]):
            continue  # the usage counts another prompt than this request's
        request_id, cached = request["request_id"], int(step.cached_tokens)
        if said.setdefault(request_id, cached) != cached:
            disputed.add(request_id)
    for request_id in disputed:
        del said[request_id]
    return said


def responses_hit_rate(requests: Iterable[tuple[str, int]], said: dict[str, int]) -> HitRate:
    """The hit rate of exactly these (request id, prompt tokens), each of which `said` holds, from their responses'
    cached tokens."""
    requests = list(requests)
    hits, queries = sum(said[request_id] for request_id, _ in requests), sum(n for _, n in requests)
    return HitRate(float(hits), float(queries), len(requests), RESPONSES)
