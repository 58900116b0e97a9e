"""Chained block hashes, vLLM V1's scheme.

A full block's hash is sha256(parent_hash or seed, its token ids, its extra keys); the chain makes a
block's hash identify the whole prefix up to and including it. Only full blocks are hashed. The
seed is fixed (like vLLM's deterministic seed for cryptographic hashes), so the same prefix hashes
the same across restarts and in the what-if simulator. Events publish the low 64 bits, as vLLM does.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes
MASK_64 = (1 << 64) - 1
ROOT_SEED: BlockHash = hashlib.sha256(b"kvobs block hash seed v1").digest()


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """Hash one full block given its parent's hash (None for the first block)."""
    h = hashlib.sha256(parent if parent is not None else ROOT_SEED)
    h.update(array("q", token_ids).tobytes())
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


def hash_chain(
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: tuple = (),
    *,
    start: int = 0,
    parent: BlockHash | None = None,
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` from block index `start`, chained from `parent`."""
    hashes: list[BlockHash] = []
    for begin in range(start * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hash_block(parent, token_ids[begin : begin + block_size], extra_keys)
        hashes.append(parent)
    return hashes


def external_hash(block_hash: BlockHash) -> int:
    """The unsigned 64-bit form vLLM publishes: the digest's low 64 bits, big-endian."""
    return int.from_bytes(block_hash, "big") & MASK_64
