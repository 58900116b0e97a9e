"""Scheduler tests without a model: each sampled step appends a fixed token."""

from __future__ import annotations

from instrumented_engine.engine import events as ev
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.scheduler import Scheduler
from instrumented_engine.engine.sequence import SequenceStatus
from tests.engine.helpers import FakeClock, make_seq

BS = 4


def new_scheduler(num_blocks: int, *, budget: int = 64, max_seqs: int = 8, chunked: bool = True) -> Scheduler:
    clock = FakeClock()
    bm = BlockManager(num_blocks, BS, clock=clock)
    return Scheduler(
        bm, max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked, clock=clock
    )


def run_step(sched: Scheduler, token: int = 1):
    out = sched.schedule()
    sched.mark_computed(out)
    for item in out.scheduled:
        seq = item.seq
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(token)
            if len(seq.output_token_ids) >= seq.sampling_params.max_tokens:
                sched.finish(seq, "length")
    return out


def test_fcfs_admission_and_decode():
    sched = new_scheduler(32)
    a, b = make_seq("a", [1] * 6, max_tokens=3), make_seq("b", [2] * 5, max_tokens=3)
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 6), ("b", 5)]
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 1)]
    run_step(sched)
    assert a.is_finished and b.is_finished and not sched.has_unfinished
    assert sched.bm.num_free_blocks == 31


def test_chunked_prefill_splits_by_budget_and_samples_only_at_the_end():
    sched = new_scheduler(32, budget=4)
    a = make_seq("a", list(range(10)), max_tokens=2)
    sched.add(a)
    chunks = []
    while not a.is_finished:
        out = run_step(sched)
        chunks.append([(s.num_new_tokens, s.samples) for s in out.scheduled])
    assert chunks == [[(4, False)], [(4, False)], [(2, True)], [(1, True)]]


def test_without_chunked_prefill_a_long_prompt_waits_for_a_full_budget():
    sched = new_scheduler(32, budget=8, chunked=False)
    a, b = make_seq("a", [1] * 6, max_tokens=4), make_seq("b", [2] * 7, max_tokens=1)
    sched.add(a)
    sched.add(b)
    out = run_step(sched)
    assert [s.seq.request_id for s in out.scheduled] == ["a"]  # b (7) does not fit in the 2 left
    out = run_step(sched)
    assert [(s.seq.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 7)]


def test_preemption_takes_most_recent_and_requeues_it_first():
    # 6 usable blocks of 4 tokens; each sequence needs 2 blocks for its 8-token prompt and grows
    sched = new_scheduler(7)
    seqs = [make_seq(n, [i * 10 + j for j in range(8)], session=f"s{n}", max_tokens=6) for i, n in enumerate("abc")]
    for s in seqs:
        sched.add(s)
    run_step(sched)  # all three admitted: 6 blocks pinned
    assert sched.bm.num_free_blocks == 0
    c_blocks = list(seqs[2].block_table)
    out = run_step(sched)  # every sequence needs a 3rd block: c (newest) is preempted
    assert [s.request_id for s in out.preempted] == ["c"]
    assert [s.seq.request_id for s in out.scheduled] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]
    assert seqs[2].status is SequenceStatus.WAITING and seqs[2].num_computed_tokens == 0
    events = sched.take_events()
    (pre,) = [e for e in events if isinstance(e, ev.Preempted)]
    assert (pre.request_id, pre.num_blocks_freed, pre.num_computed_tokens_lost) == ("c", 2, 8)
    # c's freed blocks went to the tail chain-tail first; a and b then evicted them, in that order
    evicted = [e for e in events if isinstance(e, ev.BlockEvicted)]
    assert [(e.request_id, e.owner_sessions, e.reason) for e in evicted] == [
        ("a", ("sc",), "capacity"),
        ("b", ("sc",), "capacity"),
    ]
    assert [e.block_id for e in evicted] == [c_blocks[1], c_blocks[0]]
    while sched.has_unfinished:
        run_step(sched)
    events = sched.take_events()
    resumed = [e for e in events if isinstance(e, ev.Resumed)]
    preempted = [e for e in events if isinstance(e, ev.Preempted)]
    first = {rid: next(e for e in resumed if e.request_id == rid) for rid in ("b", "c")}
    # c's prefix was evicted while it waited: its re-admission hits nothing; b, preempted later
    # with nothing to evict it, finds its 8-token prompt still cached
    assert (first["c"].hit_tokens, first["c"].num_preemptions) == (0, 1)
    assert (first["b"].hit_tokens, first["b"].num_preemptions) == (8, 1)
    assert len(resumed) == len(preempted) + 1  # every preemption is followed by one resume
    relookups = [e for e in events if isinstance(e, ev.PrefixLookup) and e.readmission]
    c_lookup = next(e for e in relookups if e.request_id == "c")
    assert c_lookup.query_tokens == 9  # its prompt + the token it had sampled
    assert sum(s.num_preemptions for s in seqs) == sched.num_preemptions_total == len(preempted) + 1
    assert all(len(s.output_token_ids) == 6 for s in seqs)


def test_no_admission_in_a_step_that_preempted():
    sched = new_scheduler(5, max_seqs=8)
    a = make_seq("a", [1] * 8, max_tokens=8)
    b = make_seq("b", [2] * 8, max_tokens=8)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    c = make_seq("c", [3] * 3, max_tokens=1)
    sched.add(c)
    out = run_step(sched)
    assert out.preempted and all(s.seq is not c for s in out.scheduled)


def test_admission_counts_prefix_hits_once():
    sched = new_scheduler(32)
    system = list(range(8))
    a = make_seq("a", system + [100, 101], max_tokens=1)
    sched.add(a)
    while sched.has_unfinished:
        run_step(sched)
    b = make_seq("b", system + [200], max_tokens=1)
    sched.add(b)
    run_step(sched)
    lookups = [e for e in sched.take_events() if isinstance(e, ev.PrefixLookup)]
    assert [(e.request_id, e.query_tokens, e.hit_tokens) for e in lookups] == [("a", 10, 0), ("b", 9, 8)]
    assert b.num_cached_tokens == 8
