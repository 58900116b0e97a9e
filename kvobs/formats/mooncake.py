"""The observed requests as Mooncake trace rows, the replay format the field shares (`kvobs export mooncake`).

    rows = mooncake_rows(store, since, until)                  # agentic rows, one per request, in arrival order
    rows = mooncake_rows(store, since, until, flavor=AIPERF)   # AIPerf's multi-turn rows

A row (Mooncake's `input_length`, `output_length`, `hash_ids`; AIPerf's `session_id`, `timestamp` or `delay`):

- `hash_ids`: the prompt's blocks, one id a block of the store's block size, from the KV events' hash chains: the
  same block is the same id in every row, numbered from 0 in the order first seen; a block no event stored (the
  prompt's last, partial one; one whose store was not collected) gets an id of its own above `FRESH_IDS`, shared
  with no row.
- `timestamp`: milliseconds from the first request's arrival, on a session's first request (and on every request
  that names no session); a later request of a session waits for the one before it instead:
- `agentic` (Dynamo's replay's agentic Mooncake): `request_id`, `wait_for` (the session's previous request),
  `tool_wait_ms` (the union of the session's tool calls in the pause before it) and `delay` (the rest of the pause).
- `aiperf` (AIPerf's Mooncake loader): `delay`, the whole pause (AIPerf has no tool waits), and no ids.

An agentic row also carries `kvobs` (`KVOBS`), what a replay needs that the format has no field for and other tools
ignore: `lookup_ms` (its prefix lookup: arrival plus queue wait), `first_token_ms` (null where not recorded) and
`finished_ms`, on the `timestamp` clock, and `output_hash_ids`, the ids of the blocks its reply filled that the KV
events stored (so a replay caches a reply's blocks under the ids a later prompt finds them by).
`kvobs whatif --trace` replays a row by these where it has them, so a run exported and replayed is the run replayed.

The requests and their chains are the what-if's (`kvobs.analytics.cache.replay_requests`): each once, its session
from its step or from the blocks tied to it. Only requests whose prompt's chain is known are written, and never one
the engine never scheduled (the rest are counted): a store filled without KV events has no hash ids to give.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import pandas as pd

from kvobs.analytics.cache import lookup_ts, never_scheduled, replayable
from kvobs.store.interface import Store

AGENTIC, AIPERF = "agentic", "aiperf"
KVOBS = "kvobs"  # an agentic row's own replay fields (the module's docstring)
FLAVORS = (AGENTIC, AIPERF)
FRESH_IDS = 2**40


@dataclass
class MooncakeTrace:
    rows: list[dict]
    block_size: int
    skipped: int = 0  # requests whose chain is unknown (or with no prompt or end)
    ids: dict[int, int] = field(default_factory=dict)  # block hash -> its id

    def jsonl(self) -> str:
        return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in self.rows)


def mooncake_rows(store: Store, since=None, until=None, *, flavor: str = AGENTIC) -> MooncakeTrace:
    """The requests of [since, until] as Mooncake rows of `flavor` (`AGENTIC` or `AIPERF`).

    Raises:
        ValueError: an unknown flavor, or no stored KV block in the range (nothing to give hash ids from)."""
    if flavor not in FLAVORS:
        raise ValueError(f"flavor is {flavor!r}; one of {', '.join(FLAVORS)}")
    found = replayable(store, since, until)  # the requests and chains the what-if replays (`ReplayPlan`)
    block_size, chains, steps = found.block_size(), found.chains, found.steps
    requests = found.requests
    scheduled = pd.Series([not never_scheduled(r) for r in requests.itertuples()], index=requests.index, dtype=bool)
    known = requests["request_id"].isin(list(chains)) & requests["prompt_tokens"].notna()
    known &= requests["finished_ts"].notna() & scheduled
    trace = MooncakeTrace([], block_size, skipped=int((~known).sum()))
    requests = requests[known].sort_values(["arrival_ts", "request_id"])
    tools = _tools_by_session(steps)
    start = float(requests["arrival_ts"].min()) if len(requests) else 0.0
    fresh = _Fresh()
    previous: dict[str, tuple[str, float]] = {}  # session -> (its last request, when it finished)
    for r in requests.itertuples(index=False):
        prompt, output = int(r.prompt_tokens), _count(r.completion_tokens)
        blocks = math.ceil(prompt / block_size)
        chain = chains[r.request_id]
        hash_ids = [trace.ids.setdefault(int(h), len(trace.ids)) for h in chain[:blocks]]
        hash_ids += [fresh.next() for _ in range(blocks - len(hash_ids))]
        # its reply's stored blocks, numbered in both flavors (a later prompt finds them by the same ids)
        replies = [
            trace.ids.setdefault(int(h), len(trace.ids)) for h in chain[blocks : (prompt + output) // block_size]
        ]
        row: dict = {"input_length": prompt, "output_length": output, "hash_ids": hash_ids}
        session = r.session_id if isinstance(r.session_id, str) else None
        if flavor == AGENTIC:
            row = {"request_id": r.request_id, **row}
            row[KVOBS] = {
                "lookup_ms": _ms(lookup_ts(r), start),
                "first_token_ms": None if pd.isna(r.first_token_ts) else _ms(r.first_token_ts, start),
                "finished_ms": _ms(r.finished_ts, start),
                "output_hash_ids": replies,
            }
        if session is not None:
            row["session_id"] = session
        before = None if session is None else previous.get(session)
        if session is None or before is None:
            row["timestamp"] = _ms(r.arrival_ts, start)
        else:
            pause_ms = max(0.0, (r.arrival_ts - before[1]) * 1000)
            tool_ms = min(pause_ms, _union_ms(tools.get(session, []), before[1], float(r.arrival_ts)))
            if flavor == AGENTIC:
                row.update(wait_for=[before[0]], delay=round(pause_ms - tool_ms, 3), tool_wait_ms=round(tool_ms, 3))
            else:
                row["delay"] = round(pause_ms, 3)
        if session is not None:
            previous[session] = (r.request_id, float(r.finished_ts))
        trace.rows.append(row)
    return trace


class _Fresh:
    """Ids of blocks no event stored: from 2**40 up (far above any seen block's), each used once."""

    def __init__(self) -> None:
        self.count = 0

    def next(self) -> int:
        self.count += 1
        return FRESH_IDS + self.count


def _tools_by_session(steps: pd.DataFrame) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    if steps.empty or "tools" not in steps:
        return out
    for session, tools in zip(steps["session_id"], steps["tools"]):
        if isinstance(tools, str):
            out.setdefault(session, []).extend((float(t["start"]), float(t["end"])) for t in json.loads(tools))
    return out


def _union_ms(spans: list[tuple[float, float]], since: float, until: float) -> float:
    """Milliseconds of (since, until] covered by any of the tool calls (overlapping calls counted once)."""
    clipped = sorted((max(a, since), min(b, until)) for a, b in spans if b > since and a < until)
    total, end = 0.0, since
    for a, b in clipped:
        if b > end:
            total += b - max(a, end)
            end = b
    return total * 1000


def _ms(ts: float, start: float) -> float:
    return round((float(ts) - start) * 1000, 3)


def _count(value) -> int:
    return 0 if value is None or pd.isna(value) else int(value)
