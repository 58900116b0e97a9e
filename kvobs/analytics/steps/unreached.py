"""Did a step's request ever reach the server? Asked of a step with no request in the store.

A missing request proves nothing alone: vLLM records no span for a request its client abandoned, and a collector
may not have heard the server at all. The store says a request never reached the server only where the servers that
could have taken it show both that they record the requests their clients abandon (rows finished `abort`) and that
their record runs past the step's end (a request of theirs finished or arrived after it). The servers that could have
taken it are those its session's (else its trace's) other requests went to, else every server in the read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvobs.semconv.metrics import FINISHED_ABORT


@dataclass(frozen=True)
class ServerRecord:
    """What the store shows of each server (instance) in a read of requests."""

    abandoned: dict  # instance -> its requests finished `abort` (a client that hung up, a deadline)
    heard_until: dict  # instance -> the latest arrival or end of its requests

    @classmethod
    def of(cls, instance: np.ndarray, arrival: np.ndarray, finished: np.ndarray, finish_reason) -> ServerRecord:
        abandoned: dict = {}
        heard: dict = {}
        aborted = (
            np.zeros(len(instance), bool) if finish_reason is None else np.asarray(finish_reason == FINISHED_ABORT)
        )
        latest = np.fmax(arrival, finished)
        for name, was_aborted, ts in zip(instance.tolist(), aborted.tolist(), latest.tolist()):
            abandoned[name] = abandoned.get(name, 0) + int(was_aborted)
            if ts == ts:
                heard[name] = max(heard.get(name, ts), ts)
        return cls(abandoned, heard)

    def unreached_words(self, servers: list[str], latency_s: float, end: float) -> str | None:
        """ "its request never reached the server in 3.00 s ..." when every one of `servers` shows it would have
        recorded the request (see the module's doc); None when the store cannot tell."""
        servers = sorted(set(servers) or set(self.abandoned))
        if not servers or end != end:
            return None
        if any(not self.abandoned.get(s) or self.heard_until.get(s, -np.inf) < end for s in servers):
            return None
        said = ", ".join(f"{s} ({self.abandoned[s]} abandoned requests recorded)" for s in servers)
        one = len(servers) == 1
        where, verb = ("the server", "records") if one else (f"any of {len(servers)} servers", "each record")
        return (
            f"its request never reached {where} in its {latency_s:.2f} s: no request of it is in the store, while "
            f"{said} {verb} the requests their clients abandon and {'was' if one else 'were'} heard "
            "past the step's end"
        )


NOT_KNOWN = (
    "no request of this step is in the store, so its time cannot be split (it may never have reached the server, or "
    "the server records no request its client abandoned: vLLM records none)"
)
