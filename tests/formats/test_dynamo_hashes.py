"""Dynamo's block hashes against Dynamo's own: the request rows its 1.6.1 frontend wrote
(`tests/fixtures/dynamo-trace`, made by `record.py` there) list each prompt's blocks' sequence hashes; the prompt each
session's first request sent (its system message and first question, SmolLM2's chat template) hashed by
`kvobs.dynamo_hashes` gives every one of them, the last partial block's included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvobs.dynamo_hashes import block_hash, next_sequence_hash, sequence_hashes

TRACE = Path(__file__).parents[1] / "fixtures" / "dynamo-trace" / "request_trace.jsonl"
SYSTEM = "You are a travel planner. Answer in one line. " * 4  # (record.py's)
FIRST_QUESTIONS = {  # each session's first question, as record.py asked it
    "trip-planner": "Plan three days in Lisbon.",
    "researcher": "Find museums open on Monday in Lisbon.",
    "cc-5f0b": "Summarise this repository.",
    None: "What is the capital of Portugal?",
}


def _first_requests() -> dict[str | None, dict]:
    firsts: dict[str | None, dict] = {}
    for line in TRACE.read_text().splitlines():
        event = json.loads(line)["event"]
        if event["event_type"] == "request_end":
            session = (event.get("agent_context") or {}).get("session_id")
            firsts.setdefault(session, event["request"])
    return firsts


def test_the_hashes_of_each_sessions_first_prompt_are_the_ones_dynamo_wrote(smollm2_source):
    firsts = _first_requests()
    assert set(firsts) == set(FIRST_QUESTIONS)
    for session, question in FIRST_QUESTIONS.items():
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        tokens = smollm2_source.tokenizer.encode(smollm2_source.tokenizer.apply_chat_template(messages))
        replay = firsts[session]["replay"]
        assert len(tokens) == replay["input_length"] == firsts[session]["input_tokens"]
        wrote = replay["input_sequence_hashes"]
        assert sequence_hashes(tokens, replay["trace_block_size"]) == wrote, session
        assert len(wrote) == -(-len(tokens) // 16) and len(tokens) % 16  # (a partial last block among them)


def test_a_chain_is_its_blocks_hashed_in_turn():
    tokens = list(range(40))
    hashes = sequence_hashes(tokens, 16)
    assert hashes[0] == block_hash(tokens[:16])  # a chain's first block: its tokens alone
    assert hashes[1] == next_sequence_hash(hashes[0], block_hash(tokens[16:32]))
    assert hashes[2] == next_sequence_hash(hashes[1], block_hash(tokens[32:]))
    assert sequence_hashes(tokens[:32], 16) == hashes[:2]  # a prefix's blocks are the longer prompt's first ones
    assert sequence_hashes([5, *tokens[1:]], 16)[1] != hashes[1]  # one token changed: every later block differs
    assert all(0 <= h < 2**64 for h in hashes)


@pytest.mark.parametrize("tokens", [[], [0], [2**32 - 1] * 16])
def test_edges(tokens):
    assert len(sequence_hashes(tokens, 16)) == -(-len(tokens) // 16)
