"""The what-if replay where the blocks name no session, or the sessions sent no spans: each request's chain is the
one ownership by inference ties to it (`kvobs.analytics.cache.ownership`), checked against the real vLLM 0.32 run whose
blocks did name their sessions."""

from __future__ import annotations

from instrumented_engine.whatif.replay import ReplayPlan
from tests.whatif.helpers import altered_copy


def chains(plan: ReplayPlan) -> dict[str, tuple]:
    return {r.request_id: (r.session_id, r.chain) for r in plan.requests}


def test_blocks_naming_no_session_replay_the_chains_the_header_gave(vllm_run, tmp_path):
    named = chains(ReplayPlan.from_store(vllm_run.store))
    blind = altered_copy(vllm_run, tmp_path, "UPDATE kv_events SET session_id = NULL")
    plan = ReplayPlan.from_store(blind)
    assert plan.inferred == 50  # (the request after the reset was sent by no recorded step: its session is unknown)
    replayed = chains(plan)
    assert replayed.items() <= named.items()  # each one the session and chain its header gave
    assert len(replayed) >= len(named) - 2
    blind.close()


def test_requests_no_step_sent_take_the_session_their_blocks_name(vllm_run, tmp_path):
    """The agents sent the header but exported no spans: the requests, vLLM's spans, name no session, and none had
    a chain to replay before. Now the 12 whose tip only one chain fits, and no other request's, replay the chain
    their session stored (12 sessions at once: most requests share their window with one of the same depth)."""
    named = chains(ReplayPlan.from_store(vllm_run.store))
    spanless = altered_copy(vllm_run, tmp_path, "DELETE FROM steps")
    plan = ReplayPlan.from_store(spanless)
    assert plan.inferred == 12 == len(plan.requests) and plan.skipped == 45
    assert chains(plan).items() <= named.items()  # each one the session and chain its blocks named
    spanless.close()
