"""Ownership by inference, live: the blocks a request stored that named no session become the session its step was
joined to (`kvobs.analytics.cache.ownership`), so that the session's footprint, its losses and its tool-pause losses
follow them as they follow a header's.

    owners = BlockOwners(activity, [stream.ingest for stream in streams])
    owners.add_requests(records)     # each export's request records (span_ingest)
    owners.run()                     # every tick: tie what can be tied and hand it to its stream (`KVIngest.adopt`)

Each stream keeps its recent stores of blocks that named no session and holds its removals of them for `HOLD_S`
(`KVIngest.infer_owners`): a request's session is known only once the agent's LLM span arrived and was joined to it
(an exporter sends spans in batches, seconds apart), and a tool pause's losses come right after the request. A
request is looked at once its stream has passed its end. One whose session is not known yet, or whose chain is
ambiguous (its session's next request may tell), is tried again until `JOIN_WAIT_S` has passed; then it is counted
by how its blocks were tied, or why not (`requests_tied`, `BlockTie`). Requests whose window holds no store naming
no session (a header named them all) are not looked at.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import replace

import pandas as pd

from collectors.kv.ingest import KVIngest
from collectors.kv.workers import RemoteIngest
from collectors.session_activity import SessionActivity
from collectors.traces.span_steps import JOIN_WAIT_S
from kvobs.analytics.cache import STORE_SLACK_S
from kvobs.semconv.spans import BLOCKS_TIED, BlockTie
from kvobs.store.rows import RequestRecord

log = logging.getLogger(__name__)

# How long a removal of a block that named no session waits for its session: the join of its step (up to the join
# wait) and, after it, the agent's exporter's batch and a tick of the collector.
HOLD_AFTER_JOIN_S = 15.0
HOLD_S = JOIN_WAIT_S + HOLD_AFTER_JOIN_S
RECENT_S = 180.0  # stores kept (stream time): a request's run, its wait for its step, its session's context
CONTEXT_S = 120.0  # a session's requests already tied, kept to tell its next one's chain by


class BlockOwners:
    """Args:
    activity: the sessions the collector's steps claimed their requests for (`SessionActivity.claimed`).
    ingests: the KV streams' ingests; each is switched to keep what ownership by inference reads.
    join_wait_s: how long a request waits for its session, or for its chain to be told apart.
    """

    def __init__(
        self,
        activity: SessionActivity,
        ingests: list[KVIngest | RemoteIngest],
        *,
        join_wait_s: float = JOIN_WAIT_S,
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.activity = activity
        self.ingests = {ingest.instance: ingest for ingest in ingests}
        self.join_wait_s = join_wait_s
        self.clock = clock
        for ingest in ingests:
            ingest.infer_owners(hold_s, RECENT_S)
        self._arrived: deque[tuple[float, RequestRecord]] = deque()  # (seen, record), not yet looked at
        self._waiting: dict[str, tuple[float, RequestRecord]] = {}  # request id -> (first seen, record)
        self._tied: deque[RequestRecord] = deque()  # requests tied, with their sessions: the context of the next
        self.requests_tied: Counter[str] = Counter()  # BlockTie -> requests counted
        self._told = False

    def add_requests(self, records: list[RequestRecord]) -> None:
        """From the OTLP receiver's threads: queued for the tick's thread (a deque's append needs no lock)."""
        now = self.clock()
        self._arrived.extend((now, record) for record in records if record.finished_ts is not None)

    def run(self, *, final: bool = False) -> int:
        """Tie the requests whose streams have passed their end (`final`: every request, each decided now: the
        collector stops); returns the blocks adopted."""
        now, adopted = self.clock(), 0
        while self._arrived:
            seen, record = self._arrived.popleft()
            self._waiting.setdefault(record.request_id, (seen, record))
        for ingest, due in self._due(final):
            context = [r for r in self._tied if r.instance == ingest.instance]
            frame = _requests(due + context, self.activity)
            since = min(r.arrival_ts for r in due + context) - STORE_SLACK_S
            looked_ids, ties, n = ingest.tie(frame, [r.request_id for r in due], since)
            looked_at = set(looked_ids)
            looked = []
            for record in due:
                if record.request_id in looked_at:
                    looked.append(record)
                else:
                    del self._waiting[record.request_id]  # a header named every block of its window
            if not looked:
                continue
            adopted += n
            by_id = ties.set_index("request_id")
            sessions = frame.set_index("request_id")["session_id"]
            for record in looked:
                tie, session = by_id.at[record.request_id, "tie"], sessions.get(record.request_id)
                waited = final or now - self._waiting[record.request_id][0] >= self.join_wait_s
                if not waited and (session is None or tie == BlockTie.AMBIGUOUS.value):
                    continue  # its step, or its session's next request, may still come
                del self._waiting[record.request_id]
                if tie in BLOCKS_TIED and session is None:
                    tie = BlockTie.NO_SESSION.value
                self.requests_tied[tie] += 1
                if tie in BLOCKS_TIED:
                    self._tied.append(replace(record, session_id=session))
            if n and not self._told:
                self._told = True
                log.info(
                    "KV events of %s name no session (no X-Session-ID reached it): each joined step's blocks are "
                    "tied to its session by inference (kvobs_collector_requests_tied_total; docs/agents.md)",
                    ingest.instance,
                )
        self._forget(now)
        return adopted

    def _due(self, final: bool) -> Iterator[tuple[KVIngest | RemoteIngest, list[RequestRecord]]]:
        """Per stream, the waiting requests it has passed the end of (`final`: all of them)."""
        only = next(iter(self.ingests.values())) if len(self.ingests) == 1 else None
        due: dict[str, list[RequestRecord]] = {}
        for _, record in list(self._waiting.values()):
            ingest = self.ingests.get(record.instance, only)  # one server: its spans may name it otherwise
            if ingest is None:
                del self._waiting[record.request_id]
                self.requests_tied[BlockTie.NO_COUNTS.value] += 1  # no KV events of its instance
            elif ingest.recent is not None and (final or _end(record) + STORE_SLACK_S <= ingest.latest_ts):
                due.setdefault(ingest.instance, []).append(record)
        for instance, records in due.items():
            yield self.ingests[instance], [replace(record, instance=instance) for record in records]

    def _forget(self, now: float) -> None:
        horizon = max((i.latest_ts for i in self.ingests.values()), default=0.0) - CONTEXT_S
        while self._tied and (self._tied[0].finished_ts or 0.0) < horizon:
            self._tied.popleft()
        for request_id, (seen, _) in list(self._waiting.items()):
            if now - seen > RECENT_S:  # its stream never passed its end (stopped, or another clock)
                del self._waiting[request_id]


def _end(record: RequestRecord) -> float:
    """A request span's end (a request record from a span always has one; else its arrival)."""
    return record.arrival_ts if record.finished_ts is None else record.finished_ts


def _requests(records: list[RequestRecord], activity: SessionActivity) -> pd.DataFrame:
    """The requests as `block_ties` reads them, each with its session (its own, or the one its step claimed) and
    its cached tokens (its own, or what its step's reply gave: which blocks it found, not stored)."""
    frame = pd.DataFrame([r.to_row() for r in records]).drop_duplicates("request_id")
    claimed = [
        s if isinstance(s, str) else activity.claimed(t, r)
        for s, t, r in zip(frame["session_id"], frame["trace_id"], frame["request_id"])
    ]
    cached = [c if pd.notna(c) else activity.cached(r) for c, r in zip(frame["cached_tokens"], frame["request_id"])]
    return frame.assign(
        session_id=pd.Series(claimed, index=frame.index, dtype=object),
        cached_tokens=pd.Series(cached, index=frame.index, dtype=object),
    )
