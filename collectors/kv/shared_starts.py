"""Chains that begin alike but not for a whole block: a shared prefix shorter than a block is never found cached.

A prefix cache finds whole blocks only. Sessions that share a system prompt of 95 tokens, served with blocks of 128,
each start a chain of their own: the first block holds the shared 95 tokens and then what differs, so its hash
differs, and every request computes the 95 tokens again, however large the cache. The KV events show it: each
chain's first block comes with its tokens (`Stored.first_tokens`), and this compares them.

    starts = SharedStarts()
    starts.see(block_hash, tokens, block_size, stored_tokens)   # a chain's first block, as it is stored
    starts.num_short, starts.num_short_tokens          # chains begun as another did, for less than a block

A chain counts as short-shared when its first block begins with the same tokens as an earlier chain's first block
(one of the `KEEP` most recent distinct ones) for at least `MIN_SHARED` tokens and less than the block: those tokens
were computed before and could not be found. Fewer than `MIN_SHARED` is a chat template's opening, not a prefix the
agents share.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

KEEP = 256  # distinct first blocks compared with (the most recent)
MIN_SHARED = 16  # tokens in common before a shared start counts
# its totals, as a stream's stats (`num_` names: counts, 0 before a worker's first report)
STARTS = ("num_starts", "num_short", "num_short_tokens", "num_short_stored_tokens")


class SharedStarts:
    def __init__(self, keep: int = KEEP, min_shared: int = MIN_SHARED) -> None:
        self.keep, self.min_shared = keep, min_shared
        self.num_starts = 0  # distinct first blocks seen (chains begun)
        self.num_short = 0  # of them, begun as an earlier one for at least `min_shared` tokens and less than a block
        self.num_short_tokens = 0  # the tokens those shared: each computed again
        self.num_short_stored_tokens = 0  # the tokens those chains stored as they began (what the shared part is of)
        self._firsts: OrderedDict[int, np.ndarray] = OrderedDict()  # first block's hash -> its tokens
        self._rows: np.ndarray | None = None  # the kept first blocks' tokens, one row each (rebuilt on change)

    def see(self, block_hash: int, tokens: list[int], block_size: int, stored_tokens: int) -> int:
        """A chain's first block as it was stored (`stored_tokens`: what its store held in all); returns the tokens
        it shared with an earlier chain's first block where that is a short-shared start, else 0."""
        if block_hash in self._firsts:  # (stored again after an eviction: the same chain's start)
            self._firsts.move_to_end(block_hash)
            return 0
        own = np.asarray(tokens[:block_size], dtype=np.int64)
        if len(own) < block_size or block_size <= 0:
            return 0
        shared = self._longest_shared(own)
        self.num_starts += 1
        self._firsts[block_hash] = own
        if len(self._firsts) > self.keep:
            self._firsts.popitem(last=False)
        self._rows = None
        if not self.min_shared <= shared < block_size:
            return 0
        self.num_short += 1
        self.num_short_tokens += shared
        self.num_short_stored_tokens += stored_tokens
        return shared

    def _longest_shared(self, own: np.ndarray) -> int:
        """The most leading tokens `own` has in common with a kept first block of its size."""
        if self._rows is None:
            same = [row for row in self._firsts.values() if len(row) == len(own)]
            self._rows = np.stack(same) if same else np.empty((0, len(own)), dtype=np.int64)
        if len(self._rows) == 0 or self._rows.shape[1] != len(own):
            return 0
        differs = self._rows != own
        first = np.where(differs.any(axis=1), differs.argmax(axis=1), len(own))  # each row's first differing token
        return int(first.max())
