"""One KV block's bookkeeping (no tensors: the cache tensors live in the model runner)."""

from __future__ import annotations

from instrumented_engine.engine.kv_cache.hashing import BlockHash, external_hash


class KVBlock:
    """A block id, its reference count, and, once full and cached, its chained hash.

    `sessions` holds every session whose requests stored or hit the block: the owners an eviction is
    attributed to. `root_hash` is the hash of the first block of the chain it belongs to, which is
    how a system-prompt change finds the blocks that depend on that prompt.
    """

    __slots__ = (
        "block_id",
        "ref_cnt",
        "block_hash",
        "parent_hash",
        "root_hash",
        "adapter",
        "sessions",
        "stored_ts",
        "last_used_ts",
        "prev_free",
        "next_free",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.parent_hash: BlockHash | None = None
        self.root_hash: BlockHash | None = None
        self.adapter: str | None = None
        self.sessions: set[str] = set()
        self.stored_ts = 0.0
        self.last_used_ts = 0.0
        self.prev_free: KVBlock | None = None
        self.next_free: KVBlock | None = None

    @property
    def is_cached(self) -> bool:
        return self.block_hash is not None

    @property
    def cached_hash(self) -> BlockHash:
        """The hash of a block in the cache; ValueError on a free one (a caller's bug)."""
        if self.block_hash is None:
            raise ValueError(f"block {self.block_id} has no hash: it is not cached")
        return self.block_hash

    @property
    def hash_int(self) -> int | None:
        return None if self.block_hash is None else external_hash(self.block_hash)

    def clear_hash(self) -> None:
        self.block_hash = self.parent_hash = self.root_hash = None
        self.adapter = None
        self.sessions = set()

    def __repr__(self) -> str:
        return f"KVBlock(id={self.block_id}, ref={self.ref_cnt}, cached={self.is_cached})"
