"""Builders for block-manager and scheduler tests: no model, a fake clock."""

from __future__ import annotations

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.sampling_params import SamplingParams


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make_seq(rid: str, tokens: list[int], session: str | None = None, max_tokens: int = 8, **kw) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(temperature=0, max_tokens=max_tokens), 0.0, session_id=session, **kw)


def admit(bm: BlockManager, seq: Sequence) -> list:
    """Look up, allocate the rest of the prompt, mark it computed and register full blocks."""
    hits = bm.lookup(seq)
    hit_tokens = len(hits) * bm.block_size
    assert bm.allocate(seq, seq.num_tokens - hit_tokens, hits)
    seq.num_computed_tokens = seq.num_tokens
    bm.register_computed_blocks(seq)
    return hits


def kinds(events) -> list[str]:
    return [e.kind for e in events]


def run_then_pause(bm: BlockManager, rid: str, tokens: list[int], session: str) -> Sequence:
    """One request of `session` runs to completion: the session is now in a tool pause."""
    seq = make_seq(rid, tokens, session=session)
    bm.begin_request(seq)
    admit(bm, seq)
    bm.free(seq)
    bm.end_request(seq)
    return seq
