"""Client-side routing of agent steps over several replicas, for tests and the demo (`kvobs agents --base-url A
--base-url B --routing ...`); in production the operator's router decides, and kvobs only observes.

    router = StepRouter([client_a, client_b], "session")
    router.pick("sess-3")        # the client of the replica this step's request goes to

Policies:
- `round_robin`: every step to the next replica, whoever's it is (a session's consecutive steps hop replicas: the
  case a prefix-aware router exists to avoid);
- `session`: each session sticks to one replica (a stable hash of its id: the same on every run and process);
- `random`: a replica drawn for each step (seeded).
"""

from __future__ import annotations

import itertools
import random
import threading
import zlib
from collections.abc import Sequence

import httpx

from kvobs.semconv.reasons import StepRouting, names

ROUTINGS = names(StepRouting)


class StepRouter:
    """Which replica's client each step uses, under one of `ROUTINGS`."""

    def __init__(self, clients: Sequence[httpx.Client], routing: str = "round_robin", *, seed: int = 0) -> None:
        if not clients:
            raise ValueError("no replica to route to")
        if routing not in ROUTINGS:
            raise ValueError(f"unknown routing {routing!r}; choose one of {', '.join(ROUTINGS)}")
        self.clients = list(clients)
        self.routing = routing
        self._turns = itertools.cycle(range(len(self.clients)))
        self._rng = random.Random(seed)
        self._lock = threading.Lock()  # sessions run on several threads

    def pick(self, session_id: str) -> httpx.Client:
        if len(self.clients) == 1:
            return self.clients[0]
        if self.routing == StepRouting.SESSION:
            return self.clients[zlib.crc32(session_id.encode()) % len(self.clients)]
        with self._lock:
            index = (
                next(self._turns) if self.routing == StepRouting.ROUND_ROBIN else self._rng.randrange(len(self.clients))
            )
        return self.clients[index]

    def close(self) -> None:
        for client in self.clients:
            client.close()
