"""Session lifecycle: following sessions between requests, over the block pool.

A session's requests begin and end (`SessionPauses` tracks who is idle since when); losses while a session is idle
are pending until hindsight settles them (`IdleLossesSettled`): in a tool pause when its next request begins, after
its end when it is ended or released, or idle past the session-end horizon (checked before every schedule, and by
the idle engine loop). Releasing a session also drops the cached free blocks only it used (`BlockEvicted`, reason
`session_release`).
"""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.pool import BlockPool
from instrumented_engine.engine.sequence import Sequence
from kvobs.semconv.reasons import EvictionReason


class SessionLifecycle:
    """Sessions' requests, pauses and ends, on `pool` (its `activity`, owners and events)."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool

    def begin_request(self, seq: Sequence) -> None:
        """A request of `seq`'s session begins: losses pending since its last request were in a tool pause, but for
        those after the request reached the server, before the engine took it (no pause: the agent was back)."""
        in_pause, waited = self.pool.activity.begin(seq.session_id, seq.arrival_ts)
        self._settle(seq.session_id, in_pause, in_pause=True)
        self._settle(seq.session_id, waited, in_pause=False)

    def end_request(self, seq: Sequence) -> None:
        self.pool.activity.end(seq.session_id, self.pool.clock())

    def expire_idle_sessions(self) -> None:
        """Sessions idle past the session-end horizon: their pending losses were after their end."""
        for session_id, num_blocks in self.pool.activity.expire(self.pool.clock()):
            self._settle(session_id, num_blocks, in_pause=False)

    def end_session(self, session_id: str) -> None:
        """The session is done, its blocks kept: what it lost while idle since its last request was lost after its
        end, and `session_ttl` no longer protects its blocks."""
        self._settle(session_id, self.pool.activity.release(session_id), in_pause=False)

    def release_session(self, session_id: str) -> int:
        """The session is done (`end_session`); the cached free blocks only it used are dropped (how many)."""
        self.end_session(session_id)
        self.pool.session_roots.pop(session_id, None)
        now = self.pool.clock()
        victims = [b for b in self.pool.cached.values() if b.ref_cnt == 0 and b.sessions == {session_id}]
        for block in victims:
            self.pool.drop(block, EvictionReason.SESSION_RELEASE, now)
        return len(victims)

    def _settle(self, session_id: str | None, num_blocks: int, *, in_pause: bool) -> None:
        if num_blocks:
            owned = self.pool.session_blocks.get(session_id, 0) if session_id is not None else 0
            self.pool.emit(ev.IdleLossesSettled(self.pool.clock(), None, session_id, num_blocks, in_pause, owned))
