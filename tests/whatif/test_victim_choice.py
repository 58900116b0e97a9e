"""The recompute tax beside the what-if, and what the other victim choice would have saved, on our engine's run."""

from __future__ import annotations

from instrumented_engine.whatif.replay import ReplayPlan, simulate
from kvobs.analytics.cache import FLEET, range_tax, tax_words
from tests.runs import NUM_BLOCKS
from tests.whatif.helpers import whatif


def test_kvobs_whatif_prints_the_observed_tax_and_the_other_policys_share(agent_run):
    out = whatif(agent_run.url, "--num-blocks", str(NUM_BLOCKS), "--ttl", "60")
    section = out.split("Recompute tax (observed")[1].splitlines()
    tax = range_tax(agent_run.store, None, None).set_index("instance")
    assert section[1] == f"- engine-test: {tax_words(tax.loc['engine-test'])}"
    assert section[2] == f"- {FLEET}: {tax_words(tax.loc[FLEET])}"
    assert "preempted" in section[1] and "not measured" not in section[1]  # our engine says its preemptions
    # the other policy, replayed at the run's size: the same numbers a replay of each gives
    plan = ReplayPlan.from_store(agent_run.store)
    own = simulate(plan, num_blocks=NUM_BLOCKS).recompute_tokens
    other = simulate(plan, num_blocks=NUM_BLOCKS, policy="session_ttl", ttl_s=60).recompute_tokens
    assert own == plan.observed["recompute_tokens"] > 0  # (the replay is the run here)
    assert section[3].startswith(
        f"Another victim choice at the observed size: session_ttl 60 s recomputes {other:,} tokens where the runs' "
        f"own policy recomputes {own:,} in the replay: it "
    )
