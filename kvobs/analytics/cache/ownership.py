"""Which request stored which blocks, and so which session owns them, where the blocks name no session.

    ties = block_ties(requests, stored)           # a row a request: its tip, its session, how it was tied (BlockTie)
    stored = owned_stored(stored, ties)           # the stored rows, with the session each one's request was tied to
    requests = tied_sessions(requests, ties)      # a request no step joined takes the session its blocks name

vLLM's `BlockStored` names a session only when the request carried `X-Session-ID` (or `session_id`), and its
request spans name no blocks. A request's blocks are still told apart by what the collector sees:
- depth: a request of p prompt and c completion tokens holds (p + c - 1) // block_size full blocks (the last token
  sampled has no KV yet), so the deepest block it stored, its tip, is that deep in the hash chain;
- time: a tip inside its prompt was stored by its prefill (arrival to first token), one past it while it decoded
  (first token to end); the block that ends its prompt existed by its first token, and every block past it was
  stored while it decoded;
- its instance; a tip that names another session is not its, and one that names its own (the header's) is taken
  before any that names none;
- its session's chain: the conversation grows by appending, so a request's tip lies on the chain of its session's
  next request (where no pair of candidates does, the tip's parent must);
- a block is stored once: a store another request surely made (its tip, and its chain up to the prefix it
  found cached) is not this request's tip.
A tie is taken only when exactly one tip is left; otherwise the request says why (`BlockTie`). A request owns its
chain from its tip up to the first block not stored while it ran (the prefix it found cached), or up to a block
another chain continued from as it was stored (a prefix two requests prefilled together is neither's).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import ChainMap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from kvobs.semconv.spans import BLOCKS_TIED, BlockTie

# A KV batch is stamped as the engine step that stored its blocks ends, as a request's first token is, on the same
# server clock: the two differ by publishing and exporting, well under this.
STORE_SLACK_S = 0.3
TIE_COLUMNS = ["request_id", "instance", "session_id", "tip_hash", "num_blocks", "tie"]
_ROUNDS = 50  # propagation rounds at most (each one removes a tip or stops)


class _Blocks:
    """The stored blocks read: parents, depths, and each instance's store events."""

    def __init__(self, stored: pd.DataFrame, before: Mapping[int, int | None] | None = None) -> None:
        self.before = before or {}  # the parents of blocks stored before what was read (looked up, never copied)
        self.parent: ChainMap[int, int | None] = ChainMap({}, self.before)  # type: ignore[arg-type]
        self.times: dict[tuple[str, int], list[float]] = {}
        self.tags: dict[tuple[str, int, float], str | None] = {}
        self.children: dict[tuple[str, int], list[tuple[float, int]]] = {}  # (instance, parent) -> (ts, child)
        for ts, instance, block_hash, parent, session in zip(
            stored["ts"], stored["instance"], stored["block_hash"], stored["parent_hash"], stored["session_id"]
        ):
            block_hash = int(block_hash)
            if block_hash not in self.parent.maps[0]:
                self.parent.maps[0][block_hash] = None if pd.isna(parent) else int(parent)
            self.times.setdefault((instance, block_hash), []).append(float(ts))
            self.tags[(instance, block_hash, float(ts))] = session if isinstance(session, str) else None
            if not pd.isna(parent):
                self.children.setdefault((instance, int(parent)), []).append((float(ts), block_hash))
        self._depth: dict[int, int | None] = {}
        self._most = len(self.parent.maps[0]) + len(self.before)  # a longer walk is a cycle
        self.by_depth: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self.undated: dict[str, list[float]] = {}  # instance -> store times of blocks whose chain's root is unknown
        for (instance, block_hash), times in self.times.items():
            times.sort()
            depth = self.depth(block_hash)
            if depth is None:
                self.undated.setdefault(instance, []).extend(times)
            else:
                self.by_depth.setdefault((instance, depth), []).extend((ts, block_hash) for ts in times)
        for by_depth in self.by_depth.values():
            by_depth.sort()
        for undated in self.undated.values():
            undated.sort()

    def depth(self, block_hash: int) -> int | None:
        """Blocks from the chain's root to this one (1: a root); None when an ancestor was not read."""
        path: list[int] = []
        node: int | None = block_hash
        while node is not None and node not in self._depth:
            if node not in self.parent or len(path) > self._most:  # (unknown ancestor, or a cycle)
                for block in path + [node]:
                    self._depth[block] = None
                return None
            path.append(node)
            node = self.parent[node]
        depth = 0 if node is None else self._depth[node]
        for block in reversed(path):
            depth = None if depth is None else depth + 1
            self._depth[block] = depth
        return self._depth.get(block_hash)

    def up(self, block_hash: int, steps: int) -> int | None:
        node: int | None = block_hash
        for _ in range(steps):
            node = None if node is None else self.parent.get(node)
        return node

    def on_chain(self, a: int | None, b: int) -> bool:
        """Whether block `a` is `b` or one of its ancestors (None: the root's parent, on every chain)."""
        if a is None:
            return True
        da, db = self.depth(a), self.depth(b)
        return da is not None and db is not None and da <= db and self.up(b, db - da) == a

    def stored_in(self, instance: str, block_hash: int, lo: float, hi: float) -> float | None:
        """The first time this block was stored on `instance` within [lo, hi]; None when it was not."""
        times = self.times.get((instance, block_hash), ())
        i = bisect_left(times, lo)
        return times[i] if i < len(times) and times[i] <= hi else None


def block_ties(
    requests: pd.DataFrame,
    stored: pd.DataFrame,
    *,
    block_size: int | None = None,
    slack_s: float = STORE_SLACK_S,
    before: Mapping[int, int | None] | None = None,
) -> pd.DataFrame:
    """Each request's tip and session (`TIE_COLUMNS`; `tie` a `BlockTie`). `requests`: the store's request rows,
    with `session_id` where known (by the request, or by the step joined to it: `chains.with_sessions`); `stored`:
    `Reads.stored_blocks` of a range starting before the requests' (a chain read from its middle has no depths);
    `before`: block -> parent of blocks stored before that range (a reader that keeps them), where chains begin."""
    if requests.empty:
        return pd.DataFrame(columns=TIE_COLUMNS)
    if stored.empty:
        return _frame([(r, None, None, BlockTie.NO_COUNTS.value) for r in requests.itertuples(index=False)], {})
    if block_size is None:
        block_size = int(stored["num_tokens"].dropna().mode().iloc[0])
    blocks = _Blocks(stored, before)
    instances = set(stored["instance"])
    only = next(iter(instances)) if len(instances) == 1 else None  # one server: its spans' name may be another
    reqs = requests.sort_values("arrival_ts", kind="stable")
    facts: dict[str, _Request | None] = {}
    cands: dict[str, set[int]] = {}
    found: dict[str, bool] = {}
    for r in reqs.itertuples(index=False):
        fact = _Request.of(r, block_size, slack_s, r.instance if r.instance in instances else only)
        facts[r.request_id] = fact
        if fact is not None:
            cands[r.request_id] = fact.tips(blocks)
            found[r.request_id] = bool(cands[r.request_id])
    _propagate(cands, facts, blocks)
    shared = _shared_tips(cands, facts, blocks)
    rows: list[tuple] = []
    owned: dict[tuple[str, int, float], str | None] = {}
    for r in reqs.itertuples(index=False):
        fact, tips = facts[r.request_id], cands.get(r.request_id, set())
        if fact is None:
            rows.append((r, None, None, BlockTie.NO_COUNTS.value))
        elif len(tips) == 1 and fact.store(blocks, next(iter(tips))) not in shared:
            tip = next(iter(tips))
            tag = fact.tag(blocks, tip)
            session = tag or fact.session
            how = BlockTie.HEADER if tag is not None and tag == fact.session else BlockTie.INFERENCE
            events = fact.owned(blocks, tip)
            for event in events if session is not None else ():
                owned[event] = session if owned.get(event, session) == session else None  # (two sessions: neither)
            rows.append((r, tip, session, how.value, len(events)))
        elif found[r.request_id]:
            rows.append((r, None, None, BlockTie.AMBIGUOUS.value))
        elif fact.undated(blocks):
            rows.append((r, None, None, BlockTie.NO_CHAIN.value))
        else:
            rows.append((r, None, None, BlockTie.STORED_NOTHING.value))
    return _frame(rows, {k: v for k, v in owned.items() if v is not None})


@dataclass(frozen=True, slots=True)
class _Request:
    """What tells a request's chain: its instance, its session where known, its depths and its times."""

    instance: str
    session: str | None
    depth: int  # of its tip: its full blocks, prompt and completion
    prompt_depth: int  # of the block that ends its prompt
    arrival: float
    first: float  # its first token: the end of its prefill
    end: float
    slack: float
    cached_blocks: int | None = None  # of its prompt, the blocks it found cached, where its count is known

    @classmethod
    def of(cls, r, block_size: int, slack_s: float, instance: str | None) -> _Request | None:
        times = [getattr(r, name, None) for name in ("arrival_ts", "first_token_ts", "finished_ts")]
        prompt, completion = getattr(r, "prompt_tokens", None), getattr(r, "completion_tokens", None)
        if instance is None or any(v is None or pd.isna(v) for v in (*times, prompt, completion)):
            return None
        session = getattr(r, "session_id", None)
        arrival, first, end = (float(t) for t in times)  # type: ignore[arg-type]
        tokens, prompt_tokens = int(prompt) + int(completion), int(prompt)  # type: ignore[arg-type]
        cached = getattr(r, "cached_tokens", None)
        return cls(
            instance,
            session if isinstance(session, str) else None,
            (tokens - 1) // block_size,
            prompt_tokens // block_size,
            arrival,
            first,
            end,
            slack_s,
            None if cached is None or pd.isna(cached) else int(cached) // block_size,
        )

    def window(self) -> tuple[float, float]:
        """When its tip can have been stored: by its prefill, or while it decoded."""
        if self.depth > self.prompt_depth:
            return self.first - self.slack, self.end + self.slack
        return self.arrival - self.slack, self.first + self.slack

    def tips(self, blocks: _Blocks) -> set[int]:
        """The blocks as deep as its tokens, stored on its instance when its tip could be, whose chain fits its
        times, naming no other session: those naming its own, where there are any."""
        if self.depth < 1:
            return set()
        lo, hi = self.window()
        events = blocks.by_depth.get((self.instance, self.depth), [])
        found: set[int] = set()
        named: set[int] = set()  # tips naming its own session: the header's, exact
        for _, tip in events[bisect_left(events, (lo, -1)) : bisect_right(events, (hi, 2**64))]:
            tag = self.tag(blocks, tip)
            if (tag is None or self.session is None or tag == self.session) and self._fits(blocks, tip):
                found.add(tip)
                if tag is not None and tag == self.session:
                    named.add(tip)
        return named or found

    def _fits(self, blocks: _Blocks, tip: int) -> bool:
        node: int | None = tip
        for _ in range(self.depth - self.prompt_depth):  # the blocks past its prompt: stored while it decoded
            if (
                node is None
                or blocks.stored_in(self.instance, node, self.first - self.slack, self.end + self.slack) is None
            ):
                return False
            node = blocks.parent.get(node)
        if node is None or self.prompt_depth < 1:
            return True
        times = blocks.times.get((self.instance, node), ())  # the block ending its prompt: there by its first token
        return times[0] <= self.first + self.slack if times else node in blocks.before

    def store(self, blocks: _Blocks, tip: int) -> tuple[str, int, float | None]:
        """(instance, block, time) of a tip's store in its window."""
        return self.instance, tip, blocks.stored_in(self.instance, tip, *self.window())

    def tag(self, blocks: _Blocks, tip: int) -> str | None:
        """The session its tip's store in its window names."""
        instance, block, ts = self.store(blocks, tip)
        return None if ts is None else blocks.tags.get((instance, block, ts))

    def owned(self, blocks: _Blocks, tip: int) -> list[tuple[str, int, float]]:
        """(instance, block, store time) of each block it stored: its chain from its tip up to its cached prefix.
        Where its count of cached tokens is known, that prefix is the one it says: the blocks past it it computed,
        so stored (another request that says it computed one too makes the block neither's: `block_ties`). Where
        not, up to a block another chain continued from as it was stored (requests sharing a prefix they prefilled
        together: either may have stored it, so neither is given it)."""
        out: list[tuple[str, int, float]] = []
        node: int | None = tip
        below: int | None = None
        depth = self.depth
        while node is not None:
            ts = blocks.stored_in(self.instance, node, self.arrival - self.slack, self.end + self.slack)
            if ts is None:
                break
            if self.cached_blocks is None and self._shared(blocks, node, below, ts):
                break
            if self.cached_blocks is not None and depth <= self.cached_blocks:
                break  # (it found this block cached: another request stored it)
            out.append((self.instance, node, ts))
            node, below, depth = blocks.parent.get(node), node, depth - 1
        return out

    def _shared(self, blocks: _Blocks, node: int, below: int | None, ts: float) -> bool:
        """Whether another chain continued from `node` (stored at `ts`) while it was being stored."""
        return any(
            child != below and self.arrival - self.slack <= at <= ts + self.slack
            for at, child in blocks.children.get((self.instance, node), ())
        )

    def undated(self, blocks: _Blocks) -> bool:
        """Whether blocks of unknown depth were stored on its instance while it ran (its tip may be one)."""
        times = blocks.undated.get(self.instance, [])
        return bisect_left(times, self.arrival - self.slack) < bisect_right(times, self.end + self.slack)


def _propagate(cands: dict[str, set[int]], facts: dict, blocks: _Blocks) -> None:
    """Narrow each request's tips until nothing changes: by its session's chain, and by the stores other requests
    surely made."""
    for _ in range(_ROUNDS):
        changed = False
        for rids in _sessions(cands, facts, blocks).values():
            live = [rid for rid in rids if cands[rid]]
            for x, y in zip(live, live[1:]):
                changed |= _continue(cands, x, y, blocks)
        # a block is stored once: a store a request surely made (its tip, and its chain up to its cached prefix)
        # is no other request's tip
        claims: dict[tuple[str, int, float | None], set[str]] = {}
        for rid, tips in cands.items():
            if len(tips) == 1:
                for event in facts[rid].owned(blocks, next(iter(tips))):
                    claims.setdefault(event, set()).add(rid)
        # a store two requests each surely made is neither's surely (they prefilled one prefix together)
        made = {event: next(iter(rids)) for event, rids in claims.items() if len(rids) == 1}
        for rid, tips in cands.items():
            fact = facts[rid]
            taken = {tip for tip in tips if made.get(fact.store(blocks, tip), rid) != rid}
            if taken:
                cands[rid] = tips - taken
                changed = True
        if not changed:
            return


def _shared_tips(cands: dict[str, set[int]], facts: dict, blocks: _Blocks) -> set[tuple[str, int, float | None]]:
    """The tip stores that are the one tip of more than one request: one block stored once, so at most one of them
    stored it, and which cannot be told (two sessions' first requests prefilling one system prompt together)."""
    seen: dict[tuple[str, int, float | None], int] = {}
    for rid, tips in cands.items():
        if len(tips) == 1:
            event = facts[rid].store(blocks, next(iter(tips)))
            seen[event] = seen.get(event, 0) + 1
    return {event for event, n in seen.items() if n > 1}


def _sessions(cands: dict[str, set[int]], facts: dict, blocks: _Blocks) -> dict[str, list[str]]:
    """Session -> its requests in arrival order: the session a request was given, or the one all its tips name."""
    out: dict[str, list[str]] = {}
    for rid, tips in cands.items():
        fact = facts[rid]
        session = fact.session
        if session is None:
            named = {fact.tag(blocks, tip) for tip in tips}
            session = named.pop() if len(named) == 1 else None
        if session is not None:
            out.setdefault(session, []).append(rid)
    return out


def _continue(cands: dict[str, set[int]], x: str, y: str, blocks: _Blocks) -> bool:
    """Keep the tips of consecutive requests x and y of one session that continue each other: x's tip on y's chain
    where some pair does so, else x's tip's parent. Where no pair does, the session's prompt did not grow by
    appending between them (a new context, a trimmed one, another tenant's calls under one name): the chain says
    nothing of them, and each keeps the tips its own depth and times left it."""
    pairs = [(a, b) for a in cands[x] for b in cands[y] if blocks.on_chain(a, b)]
    if not pairs:
        pairs = [(a, b) for a in cands[x] for b in cands[y] if blocks.on_chain(blocks.parent.get(a), b)]
    if not pairs:
        return False
    kept_x, kept_y = {a for a, _ in pairs}, {b for _, b in pairs}
    if kept_x == cands[x] and kept_y == cands[y]:
        return False
    cands[x], cands[y] = kept_x, kept_y
    return True


def _frame(rows: Iterable[tuple], owned: dict) -> pd.DataFrame:
    out = []
    for r, tip, session, how, *n in rows:
        out.append((r.request_id, r.instance, session, tip, n[0] if n else 0, how))
    frame = pd.DataFrame(out, columns=TIE_COLUMNS).astype({"tip_hash": object, "session_id": object})
    frame.attrs["owned"] = owned  # (instance, block, store time) -> session
    return frame


def owned_stored(stored: pd.DataFrame, ties: pd.DataFrame) -> pd.DataFrame:
    """`stored` with each row's `session_id` filled from the request its block was tied to, and `tie`: `header`
    where the row named its session, `inference` where a tie filled it, None where neither."""
    owned = ties.attrs.get("owned", {})
    named = stored["session_id"].notna()
    keys = zip(stored["instance"], stored["block_hash"], stored["ts"])
    found = pd.Series([owned.get((i, int(h), float(t))) for i, h, t in keys], index=stored.index, dtype=object)
    tie = pd.Series(None, index=stored.index, dtype=object)
    tie[found.notna()] = BlockTie.INFERENCE.value
    tie[named] = BlockTie.HEADER.value
    return stored.assign(session_id=stored["session_id"].where(named, found), tie=tie)


def tied_sessions(requests: pd.DataFrame, ties: pd.DataFrame) -> pd.DataFrame:
    """`requests` with a missing `session_id` taken from the session its tied blocks name (the reverse tie)."""
    if requests.empty or ties.empty:
        return requests
    tied = ties[ties["tie"].isin(BLOCKS_TIED) & ties["session_id"].notna()]
    found = requests["request_id"].map(dict(zip(tied["request_id"], tied["session_id"]))).astype(object)
    return requests.assign(session_id=requests["session_id"].where(requests["session_id"].notna(), found))


def with_tied_blocks(
    requests: pd.DataFrame, stored: pd.DataFrame, *, before: Mapping[int, int | None] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(requests, stored, ties): the requests with the sessions their blocks name, the stored rows with the sessions
    their requests were tied to (what `chains.request_chains` reads a request's chain by), and the ties."""
    named = stored["session_id"].notna().all() and requests["session_id"].notna().all()
    if requests.empty or stored.empty or named:
        return requests, stored.assign(tie=BlockTie.HEADER.value), pd.DataFrame(columns=TIE_COLUMNS)
    ties = block_ties(requests, stored, before=before)
    return tied_sessions(requests, ties), owned_stored(stored, ties), ties


def num_inferred(ties: pd.DataFrame) -> int:
    """Requests whose session's blocks were tied to them by inference (their blocks named no session)."""
    return int(((ties["tie"] == BlockTie.INFERENCE.value) & ties["session_id"].notna()).sum()) if len(ties) else 0
