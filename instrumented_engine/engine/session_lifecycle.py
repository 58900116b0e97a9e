"""Session lifecycle: the part of the block manager that follows sessions between requests.

`BlockManager` inherits it. A session's requests begin and end (`SessionPauses` tracks who is idle since when);
losses while a session is idle are pending until hindsight settles them (`IdleLossesSettled`): in a tool pause when
its next request begins, after its end when it is ended or released, or idle past the session-end horizon
(checked before every schedule, and by the idle engine loop). Releasing a session also drops the cached free
blocks only it used (`BlockEvicted`, reason `session_release`).
"""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.sequence import Sequence
from kvobs.semconv.reasons import EvictionReason


class SessionLifecycle:
    """Mixed into `BlockManager` (which provides `activity`, `cached`, `session_blocks`, `_evict`, `clock`)."""

    def begin_request(self, seq: Sequence) -> None:
        """A request of `seq`'s session begins: losses pending since its last request were in a tool pause."""
        self._settle(seq.session_id, self.activity.begin(seq.session_id), in_pause=True)

    def end_request(self, seq: Sequence) -> None:
        self.activity.end(seq.session_id, self.clock())

    def expire_idle_sessions(self) -> None:
        """Sessions idle past the session-end horizon: their pending losses were after their end."""
        for session_id, num_blocks in self.activity.expire(self.clock()):
            self._settle(session_id, num_blocks, in_pause=False)

    def _settle(self, session_id: str | None, num_blocks: int, *, in_pause: bool) -> None:
        if num_blocks:
            self._events.append(
                ev.IdleLossesSettled(
                    self.clock(), None, session_id, num_blocks, in_pause, self.session_blocks.get(session_id, 0)
                )
            )

    def end_session(self, session_id: str) -> None:
        """The session is done, its blocks kept: what it lost while idle since its last request was lost after its
        end, and `session_ttl` no longer protects its blocks."""
        self._settle(session_id, self.activity.release(session_id), in_pause=False)

    def release_session(self, session_id: str) -> int:
        """The session is done (`end_session`); the cached free blocks only it used are dropped (how many)."""
        self.end_session(session_id)
        self.session_roots.pop(session_id, None)
        now = self.clock()
        victims = [b for b in self.cached.values() if b.ref_cnt == 0 and b.sessions == {session_id}]
        for block in victims:
            self._evict(block, EvictionReason.SESSION_RELEASE, now)
            self._to_head(block)
        return len(victims)
