"""A session's losses between its requests, settled with hindsight (`SessionPauses`): in its tool pause only those
before its next request reached the server. A loss after that, before the engine took the request (between two of
its steps, on a busy machine), is no pause loss: the analyses and the what-if, which read the request's arrival,
never count it as one, and the engine's own count must agree with them (a clean-clone run on a slow machine caught
the engine alone calling such losses pause losses)."""

from __future__ import annotations

from instrumented_engine.engine.kv_cache.session_pauses import SessionPauses


def test_losses_before_the_next_request_arrived_were_in_the_pause_and_after_it_not():
    pauses = SessionPauses(end_after_s=300)
    pauses.begin("s1", arrived=0.0)
    pauses.end("s1", now=10.0)
    assert pauses.is_pending_owner("s1", now=11.0)
    pauses.lost("s1", now=11.0)  # in the tool pause
    pauses.lost("s1", now=12.5)  # the next request reached the server at 12.0; the engine took it at 13.0
    pauses.lost("s1", now=12.9)
    assert pauses.num_pending == 3
    assert pauses.begin("s1", arrived=12.0) == (1, 2)
    assert pauses.num_pending == 0 and not pauses.is_pending_owner("s1", now=13.0)


def test_a_request_the_engine_stamped_itself_settles_every_pending_loss_in_the_pause():
    pauses = SessionPauses()
    pauses.begin("s1")
    pauses.end("s1", now=1.0)
    pauses.lost("s1", now=2.0)
    assert pauses.begin("s1") == (1, 0)
    assert pauses.begin(None) == (0, 0)


def test_released_or_expired_sessions_forget_when_their_losses_happened():
    pauses = SessionPauses(end_after_s=5)
    for session in ("a", "b"):
        pauses.begin(session)
        pauses.end(session, now=0.0)
        pauses.lost(session, now=1.0)
    assert pauses.release("a") == 1
    assert pauses.expire(now=10.0) == [("b", 1)]
    pauses.begin("a", arrived=0.5)  # (a loss from before its release is not counted again)
    pauses.end("a", now=20.0)
    assert pauses.begin("a", arrived=0.0) == (0, 0)
