"""The free-block queue: an intrusive doubly linked list of every block with ref_cnt 0.

Blocks carry their own `prev_free`/`next_free` links, so removing a block from the middle (a prefix
hit reviving a cached free block) is O(1), as in vLLM V1's `FreeKVCacheBlockQueue`. The head is
evicted first; cached blocks are appended at the tail (least recently released first), uncached
blocks at the head (reused before any cached block).
"""

from __future__ import annotations

from collections.abc import Iterator

from instrumented_engine.engine.kv_cache.block import KVBlock


class FreeBlockQueue:
    def __init__(self, blocks: list[KVBlock]) -> None:
        self._head = KVBlock(-1)  # sentinels: never handed out
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVBlock]:
        """Blocks from head (evicted first) to tail."""
        node = self._head.next_free
        while node is not None and node is not self._tail:  # (a queued block always has a next: the tail at least)
            yield node
            node = node.next_free

    def peek(self) -> KVBlock:
        block = self._head.next_free
        if self.num_free_blocks == 0 or block is None:
            raise IndexError("no free blocks")
        return block

    def popleft(self) -> KVBlock:
        block = self.peek()
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        if block.prev_free is None or block.next_free is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        """Insert at the tail (evicted last)."""
        self._link(block, self._tail.prev_free or self._head, self._tail)  # (the head when empty: one and the same)

    def appendleft(self, block: KVBlock) -> None:
        """Insert at the head (taken next)."""
        self._link(block, self._head, self._head.next_free or self._tail)

    def _link(self, block: KVBlock, before: KVBlock, after: KVBlock) -> None:
        if block.prev_free is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        block.prev_free, block.next_free = before, after
        before.next_free = block
        after.prev_free = block
        self.num_free_blocks += 1
