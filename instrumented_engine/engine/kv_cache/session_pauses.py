"""Sessions between requests, and what they lost there, decided with hindsight.

    pauses = SessionPauses(end_after_s=300)
    pauses.begin("s1"); pauses.end("s1", now=10.0)     # s1 is idle from 10.0 on
    pauses.is_pending_owner("s1", now=12.0)              # True: a loss now is pending
    pauses.lost("s1", now=13.0)                          # one block lost while idle: pending
    pauses.begin("s1", arrived=14.0)                     # -> (1, 0): s1 came back, so it was in a tool pause

A session is idle from the end of its last request in flight until its next one begins. A block that capacity
pressure takes from an idle session is a *pending* loss: only what happens next tells whether the session was
in a tool pause (its next request begins: `begin` returns the settled count) or had ended (it is released, or
stays idle `end_after_s` past its last request: `release` / `expire` return the count, lost after its end).
A loss after the session's next request reached the server but before the engine took it (`begin`'s `arrived`)
was no pause loss: the agent had come back; `begin` returns it apart, as the analyses and the what-if count it.
A loss of a session already idle longer than `end_after_s` is after its end at once, never pending. Nothing is
counted as lost in a pause until it is settled so; the engine's metrics, spans, store rows and the what-if
replay all count the settlements (`IdleLossesSettled` events) and show what is still pending.
"""

from __future__ import annotations

from collections import Counter

from kvobs.semconv.sessions import SESSION_END_AFTER_S


class SessionPauses:
    """Args:
    end_after_s: a session idle this long after its last request has ended (None: only a release ends it).
    """

    def __init__(self, end_after_s: float | None = SESSION_END_AFTER_S) -> None:
        if end_after_s is not None and end_after_s <= 0:
            raise ValueError(f"end_after_s must be positive; got {end_after_s}")
        self.end_after_s = end_after_s
        self._in_flight: Counter[str] = Counter()
        self.idle_since: dict[str, float] = {}  # sessions between requests (released ones are not here)
        self.pending: dict[str, list[float]] = {}  # when each block lost while idle, not settled yet, was lost

    def begin(self, session_id: str | None, arrived: float | None = None) -> tuple[int, int]:
        """A request of the session begins (it reached the server at `arrived`; None: now); returns the pending
        losses settled as lost in its tool pause, and those lost after it arrived, before the engine took it."""
        if session_id is None:
            return 0, 0
        self._in_flight[session_id] += 1
        self.idle_since.pop(session_id, None)
        times = self.pending.pop(session_id, [])
        waited = sum(1 for at in times if arrived is not None and at >= arrived)
        return len(times) - waited, waited

    def end(self, session_id: str | None, now: float) -> None:
        if session_id is None or self._in_flight[session_id] == 0:
            return
        self._in_flight[session_id] -= 1
        if self._in_flight[session_id] == 0:
            del self._in_flight[session_id]
            self.idle_since[session_id] = now

    def release(self, session_id: str) -> int:
        """The session is done; returns its pending losses, settled as lost after its end."""
        self.idle_since.pop(session_id, None)
        return len(self.pending.pop(session_id, ()))

    def is_active(self, session_id: str) -> bool:
        return session_id in self._in_flight

    def is_pending_owner(self, session_id: str, now: float) -> bool:
        """True when a loss of this session's block now is pending: idle, and not yet past `end_after_s`."""
        since = self.idle_since.get(session_id)
        return since is not None and (self.end_after_s is None or now - since < self.end_after_s)

    def lost(self, session_id: str, now: float) -> None:
        """One block lost while the session was idle (pending until settled)."""
        self.pending.setdefault(session_id, []).append(now)

    def expire(self, now: float) -> list[tuple[str, int]]:
        """Sessions with pending losses idle past `end_after_s`: (session, blocks lost after its end)."""
        if self.end_after_s is None or not self.pending:
            return []
        ended = [s for s in self.pending if now - self.idle_since.get(s, now) >= self.end_after_s]
        return [(s, len(self.pending.pop(s))) for s in ended]

    @property
    def num_pending(self) -> int:
        return sum(map(len, self.pending.values()))
