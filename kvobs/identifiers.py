"""Identifiers from outside (session ids, request ids, adapter names): at most `MAX_ID_BYTES` UTF-8 bytes.

    id_bytes("s-1")              # 3
    clip_id("s" * 10_000)        # 'sss...s~cut:3f2a9c1b07de': 256 bytes, distinct ids stay distinct

A session id is copied into every store row of its session, so one 1 MB id would cost a hundred MB of store. The
engine refuses a longer id (400); the collector, which cannot refuse what vLLM sends, cuts it: the head, a marker
and a hash of the whole id, so two long ids with the same head are still two sessions.
"""

from __future__ import annotations

import hashlib

from kvobs.semconv.limits import MAX_ID_BYTES

CUT_MARKER = "~cut:"
_DIGEST_BYTES = 6


def id_bytes(value: str) -> int:
    """The identifier's length in UTF-8 bytes (a lone surrogate counts as its three bytes)."""
    return len(value.encode("utf-8", "surrogatepass"))


def clip_id(value: str) -> str:
    """`value` if it fits in `MAX_ID_BYTES`, else its head + `~cut:` + 12 hex digits of its hash (exactly that long)."""
    if len(value) * 4 <= MAX_ID_BYTES:  # at most 4 UTF-8 bytes a character: fits without encoding (ids a block)
        return value
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) <= MAX_ID_BYTES:
        return value
    digest = hashlib.blake2b(raw, digest_size=_DIGEST_BYTES).hexdigest()
    head = raw[: MAX_ID_BYTES - len(CUT_MARKER) - len(digest)].decode("utf-8", "ignore")
    return f"{head}{CUT_MARKER}{digest}"
