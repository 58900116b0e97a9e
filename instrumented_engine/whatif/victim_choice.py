"""The recompute tax beside the what-if: the range's tax as observed (`kvobs.analytics.recompute.range_tax`), and
how much of what the cache recomputed another victim choice would have saved: each run replayed at its observed
size and tier with the other eviction policy, against its replay with its own (replay against replay, so the
replay's error at the observed point is no saving).

    lines = tax_lines(store, plans, checks, since, until, ttl_s=30.0)
"""

from __future__ import annotations

from instrumented_engine.whatif.fidelity import DEFAULT_POLICY
from instrumented_engine.whatif.replay import ReplayPlan, simulate
from kvobs.analytics.cache import range_tax, tax_words
from kvobs.semconv.reasons import EvictionPolicyName

LRU, SESSION_TTL = EvictionPolicyName.LRU.value, EvictionPolicyName.SESSION_TTL.value


def other_policy(plans: list[ReplayPlan], checks: list, ttl_s: float) -> tuple[str, int, int] | None:
    """(the other policy's name, the tokens its replays recompute, those the runs' own policy's replays recompute),
    over the runs replayed at their observed size; None where none was. The other of `lru` is `session_ttl` at
    `ttl_s`, and the other of `session_ttl` is `lru`."""
    own = other = 0
    name = None
    for plan, check in zip(plans, checks):
        if check.replay is None or check.num_blocks is None:
            continue
        policy = plan.policy or DEFAULT_POLICY
        alternative = LRU if policy == SESSION_TTL else SESSION_TTL
        replay = simulate(
            plan, num_blocks=check.num_blocks, policy=alternative, ttl_s=ttl_s, tier_blocks=plan.tier_blocks or 0
        )
        label = replay.configuration
        name = label if name in (None, label) else "each run's other policy"
        own += check.replay.recompute_tokens
        other += replay.recompute_tokens
    return None if name is None else (name, other, own)


def tax_lines(store, plans: list[ReplayPlan], checks: list, since, until, *, ttl_s: float) -> list[str]:
    """The terminal's lines: the observed tax per instance and for the fleet, then the other victim choice's."""
    tax = range_tax(store, since, until)
    lines = ["Recompute tax (observed; in whole prompt blocks of the requests whose hash chain is known):"]
    if tax.empty:
        lines.append("- not measured: no request's hash chain is known in this range")
    lines += [f"- {row['instance']}: {tax_words(row)}" for _, row in tax.iterrows()]
    said = choice_words(other_policy(plans, checks, ttl_s))
    return lines if said is None else [*lines, said]


def choice_words(choice: tuple[str, int, int] | None) -> str | None:
    """`other_policy`'s answer in words (None where no run was replayed at its observed size)."""
    if choice is None:
        return None
    name, other, own = choice
    if not own:
        return "Another victim choice at the observed size: the replay recomputed nothing to save."
    saved = own - other
    verdict = f"saves {saved / own:.1%} of it" if saved >= 0 else f"adds {-saved / own:.1%} to it"
    return (
        f"Another victim choice at the observed size: {name} recomputes {other:,} tokens where the runs' own policy "
        f"recomputes {own:,} in the replay: it {verdict}."
    )
