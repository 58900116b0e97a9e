"""A KV stream's blocks by the names NVIDIA Dynamo's router gives them, so that Dynamo's request-trace rows, which
list each prompt's blocks by those names (`input_sequence_hashes`), find the engine's blocks they looked up.

    aliases = SequenceAliases()
    aliases.stored(event)          # a normalized store decoded with its blocks' token hashes (`Stored.token_hashes`)
    aliases.blocks(row_hashes)     # the engine's block hashes of those a trace row names, in its order, known ones

A block's Dynamo sequence hash is its parent's and its own tokens' hash (`kvobs.dynamo_hashes`): a store whose parent
was stored before the stream was read cannot be named (`num_unnamed`). Names are a function of the tokens alone, so
an old one is never wrong, only kept: the oldest are forgotten past `limit` (memory stays bounded).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvobs.block_events import Stored
from kvobs.dynamo_hashes import next_sequence_hash

MAX_ALIASES = 1 << 20  # blocks named at once: past a replica's device and host tiers' blocks


class SequenceAliases:
    def __init__(self, limit: int = MAX_ALIASES) -> None:
        self.limit = limit
        self.sequence: dict[int, int] = {}  # engine block hash -> its Dynamo sequence hash, oldest first
        self.engine: dict[int, int] = {}  # Dynamo sequence hash -> engine block hash
        self.num_unnamed = 0  # blocks stored whose chain began before the stream was read: no name

    def stored(self, event: Stored) -> None:
        locals_ = event.token_hashes
        if locals_ is None or not event.hashes:
            return
        parent = None
        if event.parent is not None:
            parent = self.sequence.get(event.parent)
            if parent is None:
                self.num_unnamed += len(event.hashes)
                return
        sequence, engine = self.sequence, self.engine
        for block, local in zip(event.hashes, locals_):
            parent = next_sequence_hash(parent, local)
            if block not in sequence:
                sequence[block] = parent
                engine[parent] = block
        while len(sequence) > self.limit:
            oldest = next(iter(sequence))
            engine.pop(sequence.pop(oldest), None)

    def blocks(self, hashes: Iterable[int]) -> list[int]:
        """The engine's block hashes of the named blocks it knows, in their order."""
        engine = self.engine
        return [engine[h] for h in hashes if h in engine]
