"""The hash chains behind the hit rate: what each request's prefix was, what an unlimited cache would have hit,
which prefixes are reused, and what was computed twice.

    graph = BlockGraph.from_stored(stored_blocks(store))
    chains = request_chains(requests, graph)         # {request_id: [block hash, ...] root first}
    rates = hit_rates(requests, chains, graph, block_size=16)

A request's chain is rebuilt from `stored` events: the deepest block stored for it (by `request_id` when the source
records it, as `kvobs serve` does; else by its session during the request, as vLLM's events allow), walked back
through parent hashes to the root. A request that stored nothing (its prompt was all cached) takes the chain of its
session's previous request.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


class BlockGraph:
    """Parent links and first-store times of every stored block."""

    def __init__(self) -> None:
        self.parent: dict[int, int | None] = {}
        self.first_stored: dict[int, float] = {}
        self._roots: dict[int, int] = {}

    @classmethod
    def from_stored(cls, stored: pd.DataFrame) -> BlockGraph:
        graph = cls()
        for ts, block_hash, parent in zip(stored["ts"], stored["block_hash"], stored["parent_hash"]):
            block_hash = int(block_hash)
            if block_hash not in graph.first_stored:
                graph.first_stored[block_hash] = ts
                graph.parent[block_hash] = None if pd.isna(parent) else int(parent)
        return graph

    def chain(self, block_hash: int) -> list[int]:
        """Root-first hashes up to `block_hash` (stops at an unknown parent or a cycle)."""
        out, seen = [], set()
        node: int | None = block_hash
        while node is not None and node not in seen:
            seen.add(node)
            out.append(node)
            node = self.parent.get(node)
        return out[::-1]

    def root(self, block_hash: int) -> int:
        """`chain(block_hash)[0]`, remembered for every block on the way, so ranking n blocks is O(n), not O(n x
        chain length)."""
        path, seen, root = [], set(), None
        node: int | None = block_hash
        while node is not None and node not in seen:
            root = self._roots.get(node)
            if root is not None:
                break
            seen.add(node)
            path.append(node)
            node = self.parent.get(node)
        if root is None:
            root = path[-1]
        for visited in path:
            self._roots[visited] = root
        return root


def with_sessions(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Fill a request's missing `session_id` from the agent step that sent it (by the request the collector joined
    it to, the response id the step got, by caller span, else by trace): vLLM's spans carry no session, the steps do."""
    if requests.empty or steps.empty or requests["session_id"].notna().all():
        return requests
    by_response: dict[object, object] = {}
    for column in ("response_id", "request_id"):  # (the collector's join, where it made one, wins)
        if column in steps:
            answered = steps[steps[column].notna()]
            by_response.update(zip(answered[column], answered["session_id"]))
    by_span = dict(zip(steps["span_id"], steps["session_id"]))
    by_trace = dict(zip(steps["trace_id"], steps["session_id"]))
    missing = requests["session_id"].isna()
    found = requests["request_id"].map(by_response).astype(object)  # (object: no float NaN column to fill with text)
    found = found.fillna(requests["parent_span_id"].map(by_span)).fillna(requests["trace_id"].map(by_trace))
    return requests.assign(session_id=requests["session_id"].where(~missing, found))


def request_chains(requests: pd.DataFrame, stored: pd.DataFrame, graph: BlockGraph) -> dict[str, list[int]]:
    """Each request's block chain (root first), keyed by `request_id`; requests with no known chain are left out."""
    chains: dict[str, list[int]] = {}
    hashes = stored["block_hash"].to_numpy(object)
    by_request: dict[object, list] = {}
    if "request_id" in stored:
        for rid, block_hash in zip(stored["request_id"].to_numpy(object), hashes):
            if isinstance(rid, str):
                by_request.setdefault(rid, []).append(block_hash)
    by_session: dict[object, tuple[np.ndarray, np.ndarray]] = {}
    if "session_id" in stored:
        known = stored["session_id"].notna().to_numpy(bool)
        frame = stored[known]
        for sid, index in frame.groupby("session_id", sort=False).indices.items():
            ts = frame["ts"].to_numpy(float)[index]
            order = np.argsort(ts, kind="stable")
            by_session[sid] = (ts[order], hashes[known][index][order])
    last_chain: dict[str, list[int]] = {}
    for req in requests.sort_values("arrival_ts").itertuples(index=False):
        own = by_request.get(req.request_id)
        if own is None and req.session_id in by_session:
            ts, blocks = by_session[req.session_id]
            end = req.finished_ts if pd.notna(req.finished_ts) else req.arrival_ts
            own = list(blocks[np.searchsorted(ts, req.arrival_ts, "left") : np.searchsorted(ts, end + 1.0, "right")])
        chain = None
        if own:
            chain = _deepest(graph, own)
        elif req.session_id in last_chain:
            chain = last_chain[req.session_id]
        if chain:
            chains[req.request_id] = chain
            if req.session_id is not None:
                last_chain[req.session_id] = chain
    return chains


def _deepest(graph: BlockGraph, blocks: list) -> list[int]:
    """The longest chain ending at one of `blocks`: it ends at a block none of the others names as its parent, so
    only those are walked (a request's blocks are one run of a chain: one walk, not one per block)."""
    hashes = {int(h) for h in blocks}
    parents = {graph.parent.get(h) for h in hashes}
    return max((graph.chain(h) for h in hashes - parents), key=len, default=[])


def lookup_ts(req) -> float:
    """When a request looked its prefix up: when it was first scheduled (arrival + queue time, where recorded). Blocks
    another request stored while this one waited in the queue can still hit."""
    return req.arrival_ts + (0.0 if pd.isna(req.queue_s) else req.queue_s)


def lookup_times(requests: pd.DataFrame) -> pd.Series:
    """`lookup_ts` of every request of a frame."""
    return requests["arrival_ts"] + requests["queue_s"].fillna(0.0)


def hit_rates(requests: pd.DataFrame, chains: dict[str, list[int]], graph: BlockGraph, *, block_size: int):
    """Per request: `prompt_tokens`, `cached_tokens` (achieved), `available_tokens` (what a cache that never
    evicts would have hit: the leading blocks of its prompt stored by anyone before its lookup, capped at
    prompt - 1 tokens as the engine caps lookups), `recompute_tokens` = available - achieved (>= 0). A request
    never scheduled (aborted in the queue: no queue time, no first token) never looked its prefix up: nothing
    available, nothing recomputed (as the replay counts it: at admission)."""
    rows = []
    for req in requests.itertuples(index=False):
        chain = chains.get(req.request_id)
        if chain is None or pd.isna(req.prompt_tokens):
            continue
        max_blocks = max(int(req.prompt_tokens) - 1, 0) // block_size
        if pd.isna(req.queue_s) and pd.isna(req.first_token_ts):
            max_blocks = 0  # never scheduled: no lookup
        available, looked_up = 0, lookup_ts(req)
        for block_hash in chain[:max_blocks]:
            if graph.first_stored.get(block_hash, float("inf")) >= looked_up:
                break
            available += 1
        cached = None if pd.isna(req.cached_tokens) else int(req.cached_tokens)
        rows.append(
            {
                "request_id": req.request_id,
                "session_id": req.session_id,
                "arrival_ts": req.arrival_ts,
                "prompt_tokens": int(req.prompt_tokens),
                "cached_tokens": cached,
                "available_tokens": available * block_size,
                "recompute_tokens": None if cached is None else max(available * block_size - cached, 0),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "request_id",
            "session_id",
            "arrival_ts",
            "prompt_tokens",
            "cached_tokens",
            "available_tokens",
            "recompute_tokens",
        ],
    )


def hit_rate_summary(rates: pd.DataFrame) -> dict:
    """Achieved vs available hit rate over requests whose cached tokens are known (token-weighted, as vLLM's)."""
    known = rates.dropna(subset=["cached_tokens"])
    prompt = known["prompt_tokens"].sum()
    return {
        "requests": len(rates),
        "achieved": known["cached_tokens"].sum() / prompt if prompt else None,
        "available": known["available_tokens"].sum() / prompt if prompt else None,
        "available_all": rates["available_tokens"].sum() / rates["prompt_tokens"].sum() if len(rates) else None,
        "recompute_tokens": int(known["recompute_tokens"].sum()),
    }


def recompute_by_session(rates: pd.DataFrame, preempted: pd.DataFrame) -> pd.DataFrame:
    """Prefill tokens computed again per session: `evicted_tokens` (cacheable prefix that missed: eviction or
    invalidation) and `preempted_tokens` (KV thrown away by preemptions), `total`."""
    evicted = rates.groupby("session_id")["recompute_tokens"].sum() if not rates.empty else pd.Series(dtype=float)
    lost = pd.Series(dtype=float) if preempted.empty else preempted.groupby("session_id")["num_tokens"].sum()
    out = pd.concat([evicted.rename("evicted_tokens"), lost.rename("preempted_tokens")], axis=1).fillna(0)
    out = out.astype(int)
    out["total"] = out["evicted_tokens"] + out["preempted_tokens"]
    return out.sort_values("total", ascending=False).rename_axis("session_id").reset_index()


def prefix_reuse(stored: pd.DataFrame) -> pd.DataFrame:
    """Prefixes (chains by their root block) ranked by the sessions that built on them: `root_hash`, `sessions`,
    `blocks` (distinct blocks chained from it), `stores` (store events: above `blocks` means recomputation),
    `first_ts`, `last_ts`."""
    if stored.empty:
        return pd.DataFrame(columns=["root_hash", "sessions", "blocks", "stores", "first_ts", "last_ts"])
    hashes, _ = _as_uint64(stored["block_hash"])
    frame = pd.DataFrame(
        {
            "root_hash": chain_roots(hashes, *_as_uint64(stored["parent_hash"])),
            "block": hashes,
            "session_id": stored["session_id"].to_numpy(),
            "ts": stored["ts"].to_numpy(),
        }
    )
    out = frame.groupby("root_hash").agg(
        sessions=("session_id", "nunique"),
        blocks=("block", "nunique"),
        stores=("block", "size"),
        first_ts=("ts", "min"),
        last_ts=("ts", "max"),
    )
    out = out.sort_values(["sessions", "stores"], ascending=False).reset_index()
    out["root_hash"] = out["root_hash"].astype(object)  # hashes as Python ints, as every read gives them
    return out


def chain_roots(hashes: np.ndarray, parents: np.ndarray, no_parent: np.ndarray) -> np.ndarray:
    """Each block's root: `BlockGraph.root` for every row at once (a block's parent is the one its first store
    named; a chain stops at a parent never stored). Pointer jumping over the parent links, so n blocks cost
    O(n log depth) in numpy; a cycle (which real hashes cannot make) falls back to `BlockGraph`."""
    distinct, first_row = np.unique(hashes, return_index=True)
    parent, known = parents[first_row], ~no_parent[first_row]
    at = np.minimum(np.searchsorted(distinct, parent), max(len(distinct) - 1, 0))
    self_index = np.arange(len(distinct))
    parent_of = up = np.where(known & (distinct[at] == parent), at, self_index)
    for _ in range(64):  # the distance covered doubles each round: 2^64 is past any chain
        jumped = up[up]
        if np.array_equal(jumped, up):
            if np.array_equal(parent_of[up], up):  # every pointer ends at a block without a parent: no cycle
                return distinct[up][np.searchsorted(distinct, hashes)]
            break
        up = jumped
    parent_hash = parents.astype(object)
    parent_hash[no_parent] = None
    graph = BlockGraph.from_stored(
        pd.DataFrame({"ts": 0.0, "block_hash": hashes.astype(object), "parent_hash": parent_hash})
    )
    return np.array([graph.root(int(h)) for h in hashes], dtype=np.uint64)


def _as_uint64(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Hashes (Python ints, None for none) as uint64 values (0 where missing) and the missing mask."""
    values = column.to_numpy(dtype=object)
    missing = pd.isna(values)
    return np.where(missing, 0, values).astype(np.uint64), missing


def eviction_churn(stored: pd.DataFrame) -> dict:
    """Blocks stored again on their instance after they were lost there (`restored`, known as the events were stored;
    the same block cached on two replicas is two blocks, neither restored): `blocks` (distinct per instance),
    `restored_blocks` (distinct ones brought back), `extra_stores` (the restores), `churn` = restores / stores, over
    the stores that know (None where none does: events stored before revision 0021). `stored`: `stored_blocks` rows
    (`instance`, `block_hash`, `restored`)."""
    # grouped as uint64, not Python ints: ten times faster at 100,000 blocks
    blocks = pd.DataFrame({"instance": stored["instance"].to_numpy(), "block": _as_uint64(stored["block_hash"])[0]})
    restored = stored["restored"].to_numpy(dtype=float)  # NaN: the store does not say
    known, again = int((~np.isnan(restored)).sum()), restored == 1
    return {
        "blocks": len(blocks.drop_duplicates()),
        "restored_blocks": len(blocks[again].drop_duplicates()),
        "extra_stores": int(again.sum()),
        "churn": float(again.sum() / known) if known else None,
    }
