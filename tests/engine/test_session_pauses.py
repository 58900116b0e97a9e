"""Idle losses decided with hindsight, on the block manager with a fake clock: a loss while a session is idle is
pending until its next request (a tool pause), its release or the session-end horizon (after its end); a loss
while its request runs is no idle loss at all."""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.observers.losses import LossTally
from tests.engine.helpers import FakeClock, admit, make_seq, run_then_pause

BS = 4


def new_bm(num_blocks: int = 5, end_after_s: float | None = 60.0) -> tuple[BlockManager, FakeClock, LossTally]:
    clock = FakeClock()
    return BlockManager(num_blocks, BS, clock=clock, session_end_after_s=end_after_s), clock, LossTally()


def fill(bm: BlockManager, rid: str, session: str) -> None:
    """A request of another session takes every free block, evicting what is cached (LRU)."""
    seq = make_seq(rid, list(range(1000, 1000 + bm.num_usable_blocks * BS)), session=session)
    bm.begin_request(seq)
    admit(bm, seq)
    bm.free(seq)
    bm.end_request(seq)


def settled(events) -> list[tuple[str, int, bool]]:
    return [(e.session_id, e.num_blocks, e.in_pause) for e in events if isinstance(e, ev.IdleLossesSettled)]


def test_a_loss_in_an_idle_session_is_pending_until_it_comes_back_then_a_pause_loss():
    bm, clock, tally = new_bm()
    run_then_pause(bm, "a1", list(range(8)), "a")  # 2 cached blocks, then a tool pause
    clock.advance(5)
    fill(bm, "b1", "b")
    tally.add(bm.take_events())
    assert tally.num_pending == 2 and tally.num_lost_in_pause == 0
    clock.advance(5)
    seq = make_seq("a2", list(range(8)) + [9], session="a")
    bm.begin_request(seq)  # a's next step
    events = bm.take_events()
    tally.add(events)
    assert settled(events) == [("a", 2, True)]
    assert (tally.num_pending, tally.num_lost_in_pause, tally.num_lost_after_end) == (0, 2, 0)


def test_a_released_session_lost_its_blocks_after_its_end_never_in_a_pause():
    bm, clock, tally = new_bm()
    run_then_pause(bm, "a1", list(range(8)), "a")
    fill(bm, "b1", "b")
    bm.release_session("a")
    tally.add(bm.take_events())
    assert (tally.num_pending, tally.num_lost_in_pause, tally.num_lost_after_end) == (0, 0, 2)


def test_a_session_idle_past_the_horizon_has_ended():
    bm, clock, tally = new_bm(end_after_s=60.0)
    run_then_pause(bm, "a1", list(range(8)), "a")
    clock.advance(10)
    fill(bm, "b1", "b")  # lost 10 s into the idle time: pending
    clock.advance(49)
    bm.expire_idle_sessions()
    assert settled(bm.take_events()) == []  # 59 s idle: still pending
    clock.advance(1)
    bm.expire_idle_sessions()
    events = bm.take_events()
    assert settled(events) == [("a", 2, False)]  # 60 s without a request: it ended, the loss was after its end
    run_then_pause(bm, "c1", list(range(200, 208)), "c")
    clock.advance(61)
    fill(bm, "b2", "b")  # c's blocks go when c is already past the horizon: after its end at once, never pending
    lost = [e for e in bm.take_events() if isinstance(e, ev.BlockEvicted) and "c" in e.owner_sessions]
    assert lost and all(e.pending_owners == () for e in lost)


def test_a_loss_during_a_running_request_or_an_invalidation_is_no_idle_loss():
    bm, clock, tally = new_bm(num_blocks=9)
    a = make_seq("a1", list(range(8)), session="a")
    bm.begin_request(a)
    admit(bm, a)
    bm.free(a)  # blocks cached, but a's request is still in flight (not ended): a is busy
    fill(bm, "b1", "b")
    events = bm.take_events()
    lost = [e for e in events if isinstance(e, ev.BlockEvicted)]
    assert [e.owner_sessions for e in lost] == [("a",), ("a",)] and all(e.pending_owners == () for e in lost)
    bm.end_request(a)
    run_then_pause(bm, "c1", list(range(300, 308)), "c")
    bm.take_events()
    bm.invalidate("session_forget", session_id="c")  # c is idle, but an invalidation is no pressure
    tally.add(bm.take_events())
    assert tally.num_pending == 0 and tally.by_reason == {"invalidation": 2}


def test_an_idle_engine_ends_sessions_past_the_horizon(smollm2_source):
    """No request runs, so no step: the engine loop itself settles the pending losses once the horizon passes."""
    from instrumented_engine.config import EngineConfig
    from instrumented_engine.engine.async_engine import AsyncEngine
    from instrumented_engine.engine.llm_engine import LLMEngine
    from instrumented_engine.sampling_params import SamplingParams
    from tests.waiting import wait_for

    clock = FakeClock()
    config = EngineConfig(num_blocks=10, block_size=16, max_model_len=128, session_end_after_s=60.0)
    engine = LLMEngine(config, source=smollm2_source, progress=False, clock=clock)
    params = SamplingParams(temperature=0, max_tokens=2)
    tally = LossTally()
    for session, first in (("a", 100), ("b", 500)):  # b's prompt needs the blocks a left cached: a is idle
        engine.add_request(list(range(first, first + 100)), params, session_id=session)
        while engine.has_unfinished_requests():
            tally.add(engine.step().events)
    assert tally.num_pending > 0
    pending = tally.num_pending
    async_engine = AsyncEngine(engine, observers=[tally])
    async_engine.start()
    try:
        clock.advance(61)
        wait_for(lambda: tally.num_lost_after_end == pending, timeout_s=10)
    finally:
        async_engine.stop()
    assert tally.num_pending == 0 and tally.num_lost_in_pause == 0
