"""A KV stream's blocks named as Dynamo names them: the decoder's token hashes, the chain they follow, the names a
row asks for, and the bound."""

from __future__ import annotations

import msgspec

from collectors.kv.sequence_aliases import SequenceAliases
from kvobs.dynamo_hashes import block_hash, sequence_hashes
from kvobs.vllm import kv_events as wire
from kvobs.vllm.normalize import decode

TOKENS = list(range(100, 164))  # 4 blocks of 16


def _payload(*events) -> bytes:
    return msgspec.msgpack.encode(wire.KVEventBatch(1.0, list(events)))


def _stored(hashes, parent, tokens) -> wire.BlockStored:
    return wire.BlockStored(hashes, parent, tokens, 16, None, None, None)


def test_the_decoder_hashes_each_whole_block_s_tokens_only_when_asked():
    payload = _payload(_stored([1, 2], None, TOKENS[:32] + [7] * 5), _stored([3], 2, TOKENS[32:48]))
    plain = decode(payload).batch.events
    assert [e.token_hashes for e in plain] == [None, None]
    first, second = decode(payload, token_hashes=True).batch.events
    assert first.token_hashes == [block_hash(TOKENS[:16]), block_hash(TOKENS[16:32])]  # (5 tokens of no block)
    assert second.token_hashes == [block_hash(TOKENS[32:48])]
    assert (first.hashes, second.hashes, first.first_tokens) == ([1, 2], [3], TOKENS[:16])  # (all else the same)


def test_a_chain_stored_in_parts_is_named_as_a_prompt_of_its_tokens_is():
    aliases = SequenceAliases()
    payload = _payload(_stored([11, 12], None, TOKENS[:32]), _stored([13, 14], 12, TOKENS[32:]))
    for event in decode(payload, token_hashes=True).batch.events:
        aliases.stored(event)
    named = sequence_hashes(TOKENS + [1, 2, 3], 16)  # a row's: its last, partial block too
    assert aliases.blocks(named) == [11, 12, 13, 14]
    assert aliases.blocks(sequence_hashes(TOKENS[16:], 16)) == []  # the same tokens from another start: no block
    assert aliases.num_unnamed == 0


def test_a_store_whose_parent_came_before_the_stream_is_not_named_and_is_counted():
    aliases = SequenceAliases()
    for event in decode(_payload(_stored([21, 22], 99, TOKENS[:32])), token_hashes=True).batch.events:
        aliases.stored(event)
    assert aliases.num_unnamed == 2 and aliases.engine == {}


def test_the_oldest_names_are_forgotten_past_the_limit():
    aliases = SequenceAliases(limit=3)
    for i in range(5):  # five one-block chains
        (event,) = decode(_payload(_stored([i], None, [i] * 16)), token_hashes=True).batch.events
        aliases.stored(event)
    assert len(aliases.sequence) == len(aliases.engine) == 3
    assert aliases.blocks([block_hash([i] * 16) for i in range(5)]) == [2, 3, 4]


def test_a_store_of_block_size_0_with_tokens_hashes_no_block_and_stops_nothing():
    payload = _payload(wire.BlockStored([5], None, TOKENS[:16], 0, None, None, None), _stored([6], None, TOKENS[:16]))
    zero, whole = decode(payload, token_hashes=True).batch.events
    assert (zero.token_hashes, whole.token_hashes) == ([], [block_hash(TOKENS[:16])])
