"""Token sampling: greedy, temperature, top-k, top-p, with per-request generators for seeds; a request with a
grammar (`SamplingParams.constraint`) samples only among the tokens it allows next, and tells it the token taken."""

from __future__ import annotations

import torch

from instrumented_engine.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int | Exception]:
    """logits (N, vocab) float32, one row per sequence -> N token ids; a row whose sampling raised gets the exception
    instead (that request fails alone; the others in the batch go on)."""
    failed: dict[int, Exception] = {}
    for i, sp in enumerate(params):
        if sp.constraint is not None:
            try:
                sp.constraint.mask(logits[i])  # the tokens its grammar forbids next: -inf
            except Exception as exc:  # noqa: BLE001 (one request's grammar must not stop the engine)
                failed[i] = exc
    greedy = logits.argmax(dim=-1).tolist()
    out: list[int | Exception] = []
    for i, sp in enumerate(params):
        if i in failed:
            out.append(failed[i])
            continue
        try:
            token = greedy[i] if sp.greedy else _sample_row(logits[i] / sp.temperature, sp, generators[i])
            if sp.constraint is not None:
                sp.constraint.accept(token)
            out.append(token)
        except Exception as exc:  # noqa: BLE001 (one request's numbers must not stop the engine)
            out.append(exc)
    return out


def _sample_row(logits: torch.Tensor, sp: SamplingParams, generator: torch.Generator | None) -> int:
    if sp.top_k > 0 and sp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sp.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = sorted_probs.cumsum(-1)
        drop = cumulative - sorted_probs > sp.top_p  # keep the smallest set reaching top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
