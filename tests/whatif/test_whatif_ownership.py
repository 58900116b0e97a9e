"""The what-if replay where the blocks name no session, or the sessions sent no spans: each request's chain is the
one ownership by inference ties to it (`kvobs.analytics.ownership`), checked against the real vLLM 0.32 run whose
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
    assert plan.inferred == 52  # (the request after the reset was sent by no recorded step: its session is unknown)
    replayed = chains(plan)
    assert replayed.items() <= named.items()  # each one the session and chain its header gave
    assert len(replayed) >= len(named) - 2
    blind.close()


def test_requests_no_step_sent_take_the_session_their_blocks_name(vllm_run, tmp_path):
    """The agents sent the header but exported no spans: the requests, vLLM's spans, name no session, and none had
    a chain to replay before. Now the 31 whose tip only one chain fits replay the chain their session stored."""
    named = chains(ReplayPlan.from_store(vllm_run.store))
    spanless = altered_copy(vllm_run, tmp_path, "DELETE FROM steps")
    plan = ReplayPlan.from_store(spanless)
    assert plan.inferred == 31 == len(plan.requests) and plan.skipped == 23
    replayed = chains(plan)
    del replayed["chatcmpl-b72dd85f85196442"]  # the request after the reset: no recorded step named its session
    assert replayed.items() <= named.items()
    spanless.close()
