"""Sessions whose prompts change near their start: each request parts from the one before at the same early block,
while the earlier request's later blocks are still cached, so the rest of the conversation is never reused. A client
that puts what changes on every call (a timestamp, a request id, a retrieved snippet) before what stays the same
makes every request miss from there on; the cache is not short, and a bigger one would not help.

    found = changing_starts(store, since, until)   # [ChangingStart]: the sessions, where they part, how often
    session_changing_start(store, session_id, requests)   # one session's, for its steps' stories

Read from the store's own record: each request's hash chain (`chains.request_chains`: its stored blocks, root first)
and its cached tokens. A later request parted from the one before at block k when the two chains share their first k
blocks and no more (so it hit no more than those), and at least `MIN_UNUSED` of the earlier chain's blocks after them
were stored before its lookup and neither removed nor evicted by then (held, and not taken). A session is named when
at least `MIN_PAIRS` of its consecutive pairs parted at the same block: one new conversation in a session is not a
pattern, and a reply the next prompt renders differently parts at the earlier chain's last blocks, not before.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from kvobs.analytics.cache.chains import BlockGraph, lookup_ts, request_chains, with_sessions
from kvobs.semconv.spans import KVEventKind
from kvobs.store.interface import Store

MIN_PAIRS = 2
MIN_UNUSED = 2  # cached blocks of the earlier request after the parting, held and not taken
FIX = (
    "put what changes on every call (a timestamp, a request id, a retrieved snippet) after the part of the prompt that "
    "stays the same, so consecutive requests share all of it"
)
_GONE = (KVEventKind.REMOVED.value, KVEventKind.EVICTED.value)


@dataclass(frozen=True)
class ChangingStart:
    session_id: str
    requests: int  # the session's requests with a known chain and cached tokens
    parted: int  # consecutive pairs that parted at `block`, the earlier one's later blocks still cached
    block: int  # the blocks they shared before parting

    @property
    def words(self) -> str:
        shared = {0: "nothing", 1: "only their first block"}.get(self.block, f"only their first {self.block} blocks")
        return (
            f"session {self.session_id}: {self.parted} of its {self.requests - 1} later requests shared {shared} "
            "with the request before it, whose later blocks were still cached and went unused: its prompt changes "
            f"near its start on every call; to fix: {FIX}"
        )


def changing_starts(store: Store, since: float | None, until: float | None) -> list[ChangingStart]:
    """The sessions in the range whose consecutive requests keep parting at the same early block."""
    requests = with_sessions(store.reads.requests(since, until), store.reads.steps(since, until))
    gone = store.reads.kv_events(since, until, kinds=list(_GONE))
    return parted_sessions(requests, store.reads.stored_blocks(since, until), gone)


def session_changing_start(store: Store, session_id: str, requests: pd.DataFrame) -> ChangingStart | None:
    """`changing_starts` of one session, over its `requests` (those a page read) and its own KV record."""
    requests = requests[requests["session_id"] == session_id]
    if len(requests) <= MIN_PAIRS:
        return None
    stored = store.reads.kv_events(kinds=[KVEventKind.STORED.value], session_id=session_id)
    gone = store.reads.kv_events(kinds=list(_GONE), session_id=session_id)
    found = parted_sessions(requests, stored, gone)
    return found[0] if found else None


def parted_sessions(requests: pd.DataFrame, stored: pd.DataFrame, gone: pd.DataFrame) -> list[ChangingStart]:
    """`changing_starts` over frames: `requests` (with their sessions), `stored` block events, the `gone` ones
    (removed and evicted)."""
    requests = requests[requests["session_id"].notna() & requests["cached_tokens"].notna()]
    if requests.empty or stored.empty:
        return []
    graph = BlockGraph.from_stored(stored)
    chains = request_chains(requests, stored, graph)
    gone_at = _gone_at(gone)
    out = []
    for session_id, group in requests.sort_values("arrival_ts").groupby("session_id", sort=True):
        rows = [r for r in group.itertuples(index=False) if chains.get(r.request_id)]
        blocks = [
            _parted(chains[before.request_id], chains[after.request_id], after, graph, gone_at)
            for before, after in zip(rows, rows[1:])
        ]
        found = [b for b in blocks if b is not None]
        if not found:
            continue
        block = max(set(found), key=found.count)
        if found.count(block) >= MIN_PAIRS:
            out.append(ChangingStart(str(session_id), len(rows), found.count(block), block))
    return out


def _parted(before: list[int], after: list[int], req, graph: BlockGraph, gone: dict[int, list[float]]) -> int | None:
    """The block at which `after` parted from `before` while `before`'s later blocks were held (None: it did not)."""
    shared = 0
    for a, b in zip(before, after):
        if a != b:
            break
        shared += 1
    unused = before[shared:]  # (its hit could not pass the parting: the chains differ from there)
    if len(unused) < MIN_UNUSED:
        return None
    looked_up = lookup_ts(req)
    for block_hash in unused[:MIN_UNUSED]:
        stored = graph.first_stored.get(block_hash, float("inf"))
        if stored >= looked_up or any(stored < ts <= looked_up for ts in gone.get(block_hash, ())):
            return None
    return shared


def _gone_at(events: pd.DataFrame) -> dict[int, list[float]]:
    """Each block hash's removal and eviction times."""
    events = events[events["block_hash"].notna()]
    out: dict[int, list[float]] = {}
    for block_hash, ts in zip(events["block_hash"], events["ts"]):
        out.setdefault(int(block_hash), []).append(float(ts))
    return out


SHORT_FIX = (
    "put the part every request shares first and make it at least one block long, or serve with smaller blocks "
    "(vLLM's --block-size 16): a prefix cache finds whole blocks only"
)
SHORT_SHARE = 0.05  # a problem where the tokens computed again are at least this share of what those chains stored


def short_start_words(kv: pd.DataFrame) -> str | None:
    """Of a step's own KV rows, a chain its request began whose first block started as an earlier chain's did, for
    less than a block (`kv_events.shared_start_tokens`, from the collector), in words with the fix; None: none."""
    if "shared_start_tokens" not in kv:
        return None
    started = kv[(kv["kind"] == KVEventKind.STORED.value) & kv["shared_start_tokens"].notna()]
    if started.empty:
        return None
    row = started.loc[started["shared_start_tokens"].idxmax()]
    block = f" of {int(row['num_tokens']):,}" if pd.notna(row["num_tokens"]) else ""
    tokens = int(row["shared_start_tokens"])
    return (
        f"its prompt began a chain of its own whose first block starts with the same {tokens:,} tokens as an earlier "
        f"chain's, less than a block{block}: a shared prefix shorter than a block is never "
        f"found cached, so it computed them again; to fix: {SHORT_FIX}"
    )


def short_starts_check(starts: float, short: float, tokens: float, stored: float) -> tuple[bool, str]:
    """(ok, words) of a replica's chains that began as an earlier chain did for less than a block (the collector's
    `kvobs_collector_kv_short_shared_*` totals: chains begun, those short-shared, their shared tokens, what they
    stored as they began). Not ok where the shared tokens, each computed again, are `SHORT_SHARE` or more of it."""
    share = tokens / stored if stored else 0.0
    words = (
        f"{short:,.0f} of {starts:,.0f} chains began with the same tokens as an earlier chain's first block for "
        f"{tokens / short:,.0f} tokens on average, less than a block: a shared prefix shorter than a block is never "
        f"found cached, so each computed it again ({tokens:,.0f} tokens, {share:.0%} of the {stored:,.0f} they stored "
        "as they began)"
    )
    ok = share < SHORT_SHARE
    return ok, f"{words}; small" if ok else f"{words}; to fix: {SHORT_FIX}"
