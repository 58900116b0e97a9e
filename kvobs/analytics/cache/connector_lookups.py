"""A KV connector's own lookups of requests (`connector_lookups`: LMCache's per-request spans), joined to the requests
they were for, and said in a line of a step's story.

    joined = lookups_of(requests, store.reads.connector_lookups(since, until))
    connector_words(joined.iloc[0])   # "lmcache found 384 of 512 prompt tokens (L1 256, L2 128); loaded in ..."

A connector names a request by the id vLLM gave it, vLLM's internal one (the client's id, `-`, 8 hex characters),
while vLLM's request span names the client's (`kvobs.semconv.lmcache_spans.client_request_id`): a lookup is a
request's where its id is the request's, or that request's internal form. A lookup of no request read is left out.
"""

from __future__ import annotations

import pandas as pd

from kvobs.semconv.lmcache_spans import client_request_id


def lookups_of(requests: pd.DataFrame, lookups: pd.DataFrame) -> pd.DataFrame:
    """The lookups that were for `requests`, each with `request_id` the request's and `connector_request_id` the id
    the connector named, in the lookups' order."""
    if lookups.empty or requests.empty:
        return lookups.iloc[0:0].assign(connector_request_id=pd.Series(dtype=object))
    known = set(requests["request_id"])
    theirs = lookups["request_id"].astype(str)
    ours = [rid if rid in known else client_request_id(rid) for rid in theirs]
    ours = [rid if rid in known else None for rid in ours]
    joined = lookups.assign(connector_request_id=theirs, request_id=pd.Series(ours, index=lookups.index, dtype=object))
    return joined[joined["request_id"].notna()]


def connector_words(row) -> str:
    """One lookup, as a step's story says it: what it found, by level, and how long its lookups, loads and stores
    took; what the span did not say is not said."""
    said = f"{row['connector']} lookup"
    if pd.notna(row["hit_tokens"]) and pd.notna(row["requested_tokens"]):
        said = f"{row['connector']} found {int(row['hit_tokens'])} of {int(row['requested_tokens'])} prompt tokens"
        pairs = (("L1", row["l1_hit_tokens"]), ("L2", row["l2_hit_tokens"]))
        levels = [f"{name} {int(n)}" for name, n in pairs if pd.notna(n)]
        if levels and int(row["hit_tokens"]):
            said += f" ({', '.join(levels)})"
    times = [
        f"{what} {row[col] * 1000:.1f} ms"
        for what, col in (("lookup", "lookup_s"), ("load", "retrieve_s"), ("store", "store_s"))
        if pd.notna(row[col])
    ]
    return said + (f"; {', '.join(times)}" if times else "")
