"""A shared prefix shorter than a block, named from the KV events' own tokens (`collectors.kv.shared_starts`).

On real vLLM 0.32 recordings (blocks of 128 tokens), imported through the collector (`kvobs import`): the truth is
read here from the recorded wire itself, each chain's first block and its tokens, apart from the collector's path.
- `vllm-frameworks-kv`: three frameworks' agents, each session opening with its framework's system prompt and tool
  list, about 96 tokens, then what differs: every new chain after the first shares those tokens with an earlier one,
  and none found them cached. Named as a problem, with its fix.
- `vllm-six-sessions-kv`: the sessions share a system prompt longer than a block (one chain start); another tenant's
  prompts share only the chat template's default system prompt, 27 tokens of 1,792: named, and called small.
- vLLM 0.32's agent run: one system prompt over a block long, one chain start: nothing to name.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from collectors.capture import import_capture
from collectors.kv.shared_starts import MIN_SHARED, SharedStarts
from kvobs.analytics.steps.story import step_story
from kvobs.store import open_store
from kvobs.vllm.kv_events import BlockStored, decode_batch
from tests.collectors.recorded import FIXTURES as VLLM_RUN

AGENTS = VLLM_RUN.parent / "agents"
NAME = "(shared prefix shorter than a block)"


def recorded_starts(folder) -> list[tuple[list[int], int]]:
    """Each distinct chain start in a recording, in order, with the tokens its store held: the first block's tokens
    (the raw wire's, not the collector's normalized events)."""
    seen, out = set(), []
    for line in (folder / "kv_events.jsonl").read_text().splitlines():
        frames = [base64.b64decode(f) for f in json.loads(line)["frames_b64"]]
        for event in decode_batch(frames[-1]).batch.events:
            if isinstance(event, BlockStored) and event.parent_block_hash is None and event.token_ids:
                first = event.block_hashes[0]
                if first not in seen:
                    seen.add(first)
                    out.append((event.token_ids[: event.block_size], len(event.token_ids)))
    return out


def shared_with_earlier(starts: list[tuple[list[int], int]]) -> list[tuple[int, int]]:
    """Per start after the first: the most leading tokens it has in common with an earlier one, and what it stored."""
    out = []
    for i, (tokens, stored) in enumerate(starts[1:], 1):
        common = [next((k for k, (a, b) in enumerate(zip(tokens, t)) if a != b), len(tokens)) for t, _ in starts[:i]]
        out.append((max(common), stored))
    return out


@pytest.mark.parametrize(
    "folder,problem",
    [(AGENTS / "vllm-frameworks-kv", True), (AGENTS / "vllm-six-sessions-kv", False), (VLLM_RUN, None)],
    ids=["frameworks", "six-sessions", "vllm-0.32"],
)
def test_a_shared_prefix_shorter_than_a_block_is_named_from_the_recorded_tokens(tmp_path, folder, problem):
    starts = recorded_starts(folder)
    short = [(n, stored) for n, stored in shared_with_earlier(starts) if MIN_SHARED <= n < 128]
    summary = import_capture(open_store(f"sqlite:///{tmp_path / 'kvobs.db'}"), folder)
    named = {name: (ok, words) for name, ok, words in summary.checks if name.endswith(NAME)}
    if problem is None:
        assert len(starts) == 1 and not short and not named
        return
    ((ok, words),) = named.values()
    tokens, stored = sum(n for n, _ in short), sum(s for _, s in short)
    assert f"{len(short)} of {len(starts)} chains began with the same tokens" in words
    assert f"each computed it again ({tokens:,} tokens, {tokens / stored:.0%} of the {stored:,} they stored" in words
    assert ok is not problem
    assert ("to fix: put the part every request shares first" in words) is problem
    if problem:
        assert len(short) == len(starts) - 1 >= 4  # every session after the first: its framework's prompt again
        assert all(90 <= n < 128 for n, _ in short)


def test_a_chain_start_counts_once_and_only_for_a_start_shared_short_of_a_block():
    starts = SharedStarts(keep=4)
    base = list(range(1000, 1016 + 10))  # 26 tokens every start shares
    block = 32

    def start(n: int) -> list[int]:
        return base + [5000 + n] * (block - len(base))

    assert starts.see(1, start(1), block, 64) == 0  # the first: nothing earlier
    assert starts.see(2, start(2), block, 96) == 26
    assert starts.see(2, start(2), block, 96) == 0  # the same chain stored again (after an eviction): once
    assert starts.see(3, [7] * 8 + start(3)[8:], block, 32) == 0  # 0 tokens in common
    assert starts.see(4, base[: MIN_SHARED - 1] + [9] * (block - MIN_SHARED + 1), block, 32) == 0  # a template's few
    assert starts.see(5, start(1), block, 32) == 0  # the whole block alike, another hash (a cache salt): not short
    totals = (starts.num_starts, starts.num_short, starts.num_short_tokens, starts.num_short_stored_tokens)
    assert totals == (5, 1, 26, 96)
    assert len(starts._firsts) == 4 and 1 not in starts._firsts  # the most recent kept
    assert starts.see(6, start(6), block, 32) == 26  # still compared with the kept ones
    assert starts.see(7, start(7)[:10], block, 32) == 0  # not a whole block: not compared
    assert np.isclose(starts.num_short_tokens / starts.num_short, 26)


def test_the_step_whose_prompt_began_a_short_shared_chain_names_the_miss(any_store):
    """The collector keeps, on each chain's first stored block, the tokens it shared short of a block
    (`kv_events.shared_start_tokens`, on every backend): the recorded wire's own counts. Each step whose request began
    such a chain says so in its story, with the fix; no other step does."""
    folder = AGENTS / "vllm-frameworks-kv"
    short = [n for n, _ in shared_with_earlier(recorded_starts(folder)) if MIN_SHARED <= n < 128]
    import_capture(any_store, folder)
    stored = any_store.reads.stored_blocks()
    began = stored[stored["shared_start_tokens"].notna()]
    assert sorted(began["shared_start_tokens"].astype(int)) == sorted(short)
    steps = any_store.reads.steps()
    named = {}
    for session_id, index in steps[["session_id", "step_index"]].itertuples(index=False):
        said = [m for m in step_story(any_store, session_id, index).misses if "shorter than a block" in m]
        if said:
            named[(session_id, index)] = said[0]
    assert len(named) == len(began) and {s for s, _ in named} == set(began["session_id"])
    for words in named.values():
        assert "less than a block of 128: a shared prefix shorter than a block is never found cached" in words
        assert "to fix: put the part every request shares first" in words
