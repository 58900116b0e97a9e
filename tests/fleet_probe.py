"""The truth of a fleet run, read from the replicas' own block managers: what each request's lookup found at home
and what the other replicas held at that moment (tests/analytics/test_routing_loss.py, and the recorder of the
two-replica fixture, tests/fixtures/fleet-kvobs-serve/record.py)."""

from __future__ import annotations


class LookupProbe:
    """Around each replica's `BlockManager.lookup` (the scheduler calls it at admission): the longest prefix of the
    request's own block hashes cached on each other replica's manager at that moment, minus what it found at home.
    With one request at a time (`--concurrency 1`) the other replica is idle while it is read."""

    def __init__(self, servers: dict) -> None:
        self.managers = {name: server.engine.engine.block_manager for name, server in servers.items()}
        self.routed: dict[str, int] = {}  # request id -> blocks another replica held beyond its own hit
        self.held_by: dict[str, str] = {}
        self.own: dict[str, int] = {}  # request id -> blocks it found on its own replica
        for name, manager in self.managers.items():
            manager.lookup = self._probe(name, manager, manager.lookup)

    def _probe(self, name, manager, lookup):
        def probed(seq):
            hits = lookup(seq)
            chain = seq.block_hashes[: (seq.num_tokens - 1) // manager.block_size]
            best, where = 0, None
            for other, held in self.managers.items():
                n = next((i for i, h in enumerate(chain) if h not in held.cached), len(chain)) if other != name else 0
                if n > best:
                    best, where = n, other
            if seq.num_cached_tokens is None:  # its first admission (a readmission is not a routing decision)
                self.routed[seq.request_id] = max(best - len(hits), 0)
                self.own[seq.request_id] = len(hits)
                if best > len(hits):
                    self.held_by[seq.request_id] = where
            return hits

        return probed
