"""Dynamo's request-trace rows joined with the KV events of the workers that served them (`kvobs collect
--dynamo-trace DIR --kv-events ...`): each row's request becomes the request of the stream that held its blocks, and
the blocks it named that named no session become its session's, so the session's footprint, its losses and its
tool-pause losses are counted as a header's would be.

    join = DynamoJoin([stream.ingest for stream in streams])   # each stream named its blocks (`name_sequences`)
    requests = join.join(requests)                             # before they are stored: instances told
    join.outcomes                                              # TraceJoin -> requests

A row names its prompt's blocks by Dynamo's sequence hashes (`replay.input_sequence_hashes`), and each stream names
the blocks it stored the same way from their tokens (`collectors.kv.sequence_aliases`): the join is exact, not
inferred. Dynamo's worker ids are not the collector's stream names, so the stream is the one that holds the most of
a row's blocks; where streams hold as many (a prefix every worker cached), the stream its worker was seen on alone
before, else none (`ambiguous`): a request is never given to a stream it cannot be shown to have run on. Requests
are joined in arrival order: a block two sessions named is the first's.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from kvobs.semconv.spans import TraceJoin

if TYPE_CHECKING:
    from collectors.dynamo_trace import _Request
    from collectors.kv.ingest import KVIngest
    from collectors.kv.workers import RemoteIngest

log = logging.getLogger(__name__)


class DynamoJoin:
    def __init__(self, ingests: list[KVIngest | RemoteIngest]) -> None:
        self.ingests = ingests
        self.outcomes: Counter[str] = Counter({o.value: 0 for o in TraceJoin})
        self.workers: dict[str, str] = {}  # Dynamo's worker (as a row names it) -> the stream it was told to be
        self.num_adopted = 0  # blocks that named no session, made the sessions' the rows named
        self._said: set[str] = set()

    def join(self, requests: list[_Request]) -> list[_Request]:
        """The requests, each joined to its stream where one held its blocks (its record's `instance`); the blocks of
        those with a session adopted by it."""
        requests = sorted(requests, key=lambda r: r.record.arrival_ts)
        asking = [r for r in requests if r.named]
        held = {i.instance: i.sequence_blocks([list(r.named) for r in asking]) for i in self.ingests} if asking else {}
        out: list[_Request] = []
        adopt: dict[str, list[tuple[str, list[int]]]] = {instance: [] for instance in held}
        counts = iter(range(len(asking)))
        for request in requests:
            if not request.named:
                self._count(TraceJoin.NO_BLOCKS)
                out.append(request)
                continue
            k = next(counts)
            stream, outcome = self._stream(request, {instance: n[k] for instance, n in held.items()})
            self._count(outcome)
            if stream is None:
                out.append(request)
                continue
            if request.worker is not None:
                self.workers.setdefault(request.worker, stream)
            if request.record.session_id is not None:
                adopt[stream].append((request.record.session_id, list(request.named)))
            out.append(replace(request, record=replace(request.record, instance=stream)))
        for ingest in self.ingests:
            if adopt.get(ingest.instance):
                self.num_adopted += ingest.adopt_sequences(adopt[ingest.instance])
        return out

    def _stream(self, request: _Request, held: dict[str, int]) -> tuple[str | None, TraceJoin]:
        most = max(held.values(), default=0)
        if most == 0:  # (the streams' block sizes asked only then: a worker's is a call to its process)
            sized = [s for i in self.ingests if (s := getattr(i, "block_size", None)) is not None]
            if request.block_size is not None and sized and request.block_size not in sized:
                return None, TraceJoin.BLOCK_SIZE_DIFFERS
            return None, TraceJoin.NOT_HELD
        best = [instance for instance, n in held.items() if n == most]
        if len(best) == 1:
            return best[0], TraceJoin.JOINED
        told = self.workers.get(request.worker) if request.worker is not None else None
        return (told, TraceJoin.JOINED) if told in best else (None, TraceJoin.AMBIGUOUS)

    def _count(self, outcome: TraceJoin) -> None:
        self.outcomes[outcome.value] += 1
        if outcome is not TraceJoin.JOINED and outcome.value not in self._said:
            self._said.add(outcome.value)
            log.warning(
                "a Dynamo request-trace row was not joined with its worker's KV events: %s (counted on "
                'kvobs_collector_dynamo_trace_joins_total{outcome="%s"}; docs/coming-from.md)',
                _WHY[outcome],
                outcome.value,
            )


_WHY = {
    TraceJoin.NOT_HELD: "no KV stream held a block it named (is each worker's --kv-events collected?)",
    TraceJoin.AMBIGUOUS: "several KV streams held as many of its blocks",
    TraceJoin.NO_BLOCKS: "it names no blocks (replay.input_sequence_hashes)",
    TraceJoin.BLOCK_SIZE_DIFFERS: "its blocks (replay.trace_block_size) are of another size than the engines'",
}
