"""Keyed block hashes: a store that holds no hash an engine computed from a prompt's tokens.

    key = HashKey.from_file("/run/secrets/kvobs-hash-key")     # or `HashKey.from_env()` (`KVOBS_HASH_KEY_FILE`)
    batch = key.batch(batch)           # a normalized KV-event batch with every block hash keyed
    key.hash(h)                        # one hash: HMAC-SHA256(secret, h as 8 bytes)'s first 8 bytes, unsigned

An engine's block hash is a function of the prompt's tokens (and a seed some engines leave fixed), so whoever holds a
store of them and a guess at a prompt can check the guess. With a key, kvobs stores HMAC-SHA256 of each hash under a
secret the operator holds instead: equal hashes stay equal and different ones stay different (up to 64-bit
collisions), so chains, ownership, lookups and every analysis read the same, and a guess cannot be checked without
the secret. Every writer of one store must use the same key: the collector keys each engine's KV events as they
arrive, `kvobs serve` its own rows. The key's fingerprint (an HMAC of a fixed text, not the key) is what the start-up
log shows. kvobs stores no token ids either way: a chain's first block's tokens are read in memory only (to
count how many tokens two chains' starts share).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from msgspec.structs import replace

from kvobs.block_events import Batch, Placeholder, Removed, Stored, UnknownTier

HASH_KEY_ENV = "KVOBS_HASH_KEY_FILE"
MIN_KEY_BYTES = 16  # a shorter secret is refused: a guessable key keys nothing
CACHE_SIZE = 1 << 20  # hashes keyed recently (a block is stored, then removed: each hash is keyed twice)
_FINGERPRINT_TEXT = b"kvobs hash key fingerprint"


class HashKey:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(f"a hash key needs at least {MIN_KEY_BYTES} bytes of secret; got {len(secret)}")
        self._secret = secret
        self._cache: dict[int, int] = {}
        self.fingerprint = hmac.new(secret, _FINGERPRINT_TEXT, hashlib.sha256).hexdigest()[:12]

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> HashKey:
        """The secret in `path` (its bytes, a trailing newline left out).

        Raises:
            ValueError: the file cannot be read or holds fewer than `MIN_KEY_BYTES` bytes.
        """
        try:
            secret = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ValueError(f"hash key file {path}: {exc.strerror or exc}") from None
        try:
            return cls(secret)
        except ValueError as exc:
            raise ValueError(f"hash key file {path}: {exc}") from None

    @classmethod
    def from_env(cls, path: str | None = None) -> HashKey | None:
        """The key in `key_file(path)`; None where no file is given."""
        path = key_file(path)
        return None if path is None else cls.from_file(path)

    def hash(self, value: int) -> int:
        keyed = self._cache.get(value)
        if keyed is None:
            digest = hmac.digest(self._secret, value.to_bytes(8, "big"), "sha256")
            keyed = int.from_bytes(digest[:8], "big")
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
            self._cache[value] = keyed
        return keyed

    def hashes(self, values: list[int]) -> list[int]:
        return [self.hash(value) for value in values]

    def text(self, value: str | None) -> str | None:
        """An extra key's text (a cache salt, a multimodal item's id), keyed the same way: equal stays equal."""
        if value is None:
            return None
        return "hmac:" + hmac.new(self._secret, value.encode(), hashlib.sha256).hexdigest()[:32]

    def batch(self, batch: Batch) -> Batch:
        """`batch` with every block hash, parent and extra key keyed (a new batch; the events are copied)."""
        events: list = []
        for event in batch.events:
            if type(event) is Stored:
                parent = None if event.parent is None else self.hash(event.parent)
                extra = None if event.extra_keys is None else [self.text(k) for k in event.extra_keys]
                events.append(replace(event, hashes=self.hashes(event.hashes), parent=parent, extra_keys=extra))
            elif type(event) in _HASHED:
                events.append(replace(event, hashes=self.hashes(event.hashes)))  # type: ignore[union-attr]
            else:
                events.append(event)
        return Batch(batch.ts, events, batch.data_parallel_rank, batch.ids_cut)


_HASHED = (Removed, Placeholder, UnknownTier)


def key_file(path: str | None = None) -> str | None:
    """The key's file: `path`, else the one `KVOBS_HASH_KEY_FILE` names; None where neither is given."""
    return path or os.environ.get(HASH_KEY_ENV) or None
