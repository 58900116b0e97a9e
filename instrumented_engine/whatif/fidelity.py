"""Does the replay reproduce the run before it predicts? The replay at each run's observed cache size and policy,
against the hit rate the run achieved: the error at the observed point, and when it is more than `WITHIN_POINTS`,
the causes the data shows.

    check, per_run = fidelity(plans, observed_total(plans, store, since, until)["hit"])
    check.error_points, check.reproduces, check.describe()

A curve whose point at the observed configuration misses the run is no evidence of what another size would do: the
What-if page and `kvobs whatif` say so beside it, with the reason (requests without a known chain, an engine that
counted traffic whose requests never reached kvobs, counters scraped over part of the run).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from instrumented_engine.whatif.engine_rules import REGISTERS_WORDS, registers_of
from instrumented_engine.whatif.fleet import FleetPlan, FleetResult
from instrumented_engine.whatif.replay import REPLAY_WORDS, ReplayPlan, simulate
from instrumented_engine.whatif.units import WhatIfResult
from kvobs.analytics.cache import COUNTERS, REQUESTS, HitRate
from kvobs.analytics.runs import Span
from kvobs.analytics.steps import RESPONSES
from kvobs.semconv.reasons import EvictionPolicyName
from kvobs.times import local_time

WITHIN_POINTS = 2.0  # the replay reproduces a run when its hit rate there is this close (percentage points)
SAME_TRAFFIC = 0.05  # counters' and requests' prompt tokens this close (a share) count the same traffic
DEFAULT_POLICY = EvictionPolicyName.LRU.value  # vLLM's, SGLang's and TensorRT-LLM's, for runs that record none
OBSERVED_FROM = {  # `HitRate.source` -> what the observed rate counted, in the check's words
    RESPONSES: "as the replayed requests' responses said",
    REQUESTS: "as its requests said",
    COUNTERS: "as the engine's counters counted",
    f"{REQUESTS} and {COUNTERS}": "as its requests said, and the engine's counters where they did not",
}
PAUSES_NOT_COMPARABLE = (
    "Lost in tool pauses is not compared with the observed here: an engine's KV events (vLLM's) name only the "
    "session that stored a block, so the observed count gives a block lost in a pause to that session alone, while "
    "the replay counts it for every session whose requests used it. Our engine's runs, replayed step for step, "
    "count both the same way."
)


@dataclass(frozen=True)
class Fidelity:
    """The replay at the observed configuration against the run (or runs, added up)."""

    num_blocks: int | None  # the observed cache size (None: unknown, or the runs differ)
    policy: str
    observed: float | None  # the run's hit rate (`kvobs.analytics.cache.hit_rate`)
    replay: WhatIfResult | None  # the replay at `num_blocks` and `policy` (None: it could not be made)
    reasons: tuple[str, ...] = ()  # why they differ, when they do (or why no check could be made)
    policy_assumed: bool = False  # the run recorded no policy: `DEFAULT_POLICY` replayed
    configuration: str | None = None  # what was replayed, when not one size and policy (a fleet)
    others: str = "sizes"  # what the replay predicts besides the observed point ("routers" for a fleet)
    runs_off: tuple[tuple[Span, float], ...] = ()  # runs added up: those off by more (their span, their error)
    pauses_comparable: bool = True  # the replay's tool-pause losses count what the observed ones count
    observed_source: str = ""  # where `observed` came from (`HitRate.source`)
    answered: tuple[int, int] | None = None  # compared on responses: (requests whose responses said, replayed)
    registers: str | None = None  # a whole-length replay: when a prompt's blocks became findable (`REGISTERS`)
    engine_assumed: bool = False  # ... by vLLM's rule, the run having said no engine

    @property
    def replayed(self) -> float | None:
        return None if self.replay is None else self.replay.hit_rate

    @property
    def error_points(self) -> float | None:
        if self.observed is None or self.replayed is None:
            return None
        return 100.0 * (self.replayed - self.observed)

    @property
    def reproduces(self) -> bool | None:
        """Within `WITHIN_POINTS` of the run; None when either side is unknown."""
        error = self.error_points
        return None if error is None else abs(error) <= WITHIN_POINTS

    def describe(self, clock_iso=local_time) -> str:
        """One paragraph: the error at the observed point, what it means for the curve, and why (`clock_iso`:
        epoch s to the text of a time, for the runs named)."""
        if self.reproduces is None:
            return "The replay could not be checked against the run: " + "; ".join(self.reasons) + "."
        policy = f"policy {self.policy}" + (", assumed: the run recorded none" if self.policy_assumed else "")
        tier = self.replay.tier_blocks if self.replay is not None else 0
        below = f" over an offload tier of {tier} blocks" if tier else ""
        size = f"{self.num_blocks} blocks" if self.num_blocks is not None else "each run at its own size"
        configuration = self.configuration or f"{size}{below}; {policy}"
        if self.registers is not None:
            assumed = ", assumed: the run said no engine" if self.engine_assumed else ""
            configuration += f"; {REGISTERS_WORDS[self.registers]}{assumed}"
        source = observed_words(self.observed_source)
        if self.answered is not None:
            said, replayed = self.answered
            whose = "own records" if self.observed_source == REQUESTS else "responses"
            source = f"as {said:,} of the {replayed:,} replayed requests' {whose} said; the replay's over those"
        head = (
            f"At the observed configuration ({configuration}) the replay hits {self.replayed:.1%} where the run hit "
            f"{self.observed:.1%}{f' ({source})' if source else ''}: {self.error_points:+.1f} points."
        )
        if self.reproduces:
            return f"{head} Within {WITHIN_POINTS:g} points: the replay reproduces the run before it predicts."
        why = " Why: " + "; ".join(self.reasons) + "." if self.reasons else ""
        if self.runs_off:
            off = "; ".join(f"{span.label(clock_iso)} ({error:+.1f} points)" for span, error in self.runs_off)
            why += f" Runs off: {off}; each run's check says why."
        return f"{head} More than {WITHIN_POINTS:g} points off: the other {self.others} are no evidence.{why}"


def observed_words(source: str) -> str:
    """What an observed hit rate of `source` (`HitRate.source`) counted, in words ("" when nothing says)."""
    return OBSERVED_FROM.get(source, f"from the {source}" if source else "")


def fidelity(plans: list[ReplayPlan], observed: HitRate) -> tuple[Fidelity, list[Fidelity]]:
    """Each plan replayed at its run's observed size and policy, checked against its run; and the runs together
    against `observed` (the range's hit rate, `runs.observed_total`'s `hit`)."""
    per_run = [run_fidelity(plan) for plan in plans]
    checked = [(plan, check) for plan, check in zip(plans, per_run) if check.replay is not None]
    if not checked:
        why = tuple(dict.fromkeys(r for check in per_run for r in check.reasons))
        return Fidelity(None, DEFAULT_POLICY, observed.rate, None, why), per_run
    replays = [check.replay for _, check in checked if check.replay is not None]
    tiers = {r.tier_blocks for r in replays}
    replay = WhatIfResult(
        0,
        "",
        hit_tokens=sum(r.hit_tokens for r in replays),
        query_tokens=sum(r.query_tokens for r in replays),
        tier_blocks=tiers.pop() if len(tiers) == 1 else 0,
    )
    sizes = {check.num_blocks for _, check in checked}
    policies = {check.policy for _, check in checked}
    one = len(plans) == 1
    reasons = list(per_run[0].reasons) if one else []
    runs_off = tuple(
        (plan.span, check.error_points)
        for plan, check in checked
        if not one and plan.span is not None and check.reproduces is False and check.error_points is not None
    )
    unchecked = len(plans) - len(checked)
    if unchecked:
        reasons.append(f"{unchecked} of {len(plans)} runs could not be replayed at their observed size")
    total = Fidelity(
        sizes.pop() if len(sizes) == 1 else None,
        policies.pop() if len(policies) == 1 else "each run's own",
        observed.rate,
        replay,
        tuple(reasons),
        any(check.policy_assumed for _, check in checked),
        runs_off=runs_off,
        pauses_comparable=all(check.pauses_comparable for check in per_run),
        observed_source=observed.source,
        answered=_answered([check.answered for _, check in checked]),
    )
    return total, per_run


def _answered(counts: list[tuple[int, int] | None]) -> tuple[int, int] | None:
    """The runs' (said, replayed) added up, where every run was compared on its responses."""
    if not counts or None in counts:
        return None
    return sum(c[0] for c in counts if c), sum(c[1] for c in counts if c)


def fleet_fidelity(fleet: FleetPlan, routed: FleetResult) -> Fidelity:
    """The router what-if's `as_routed` replay (`routed`) against the fleet's observed hit rate."""
    plan = fleet.plan
    as_routed = WhatIfResult(0, routed.policy, requests=routed.requests, query_tokens=routed.query_tokens)
    as_routed.hit_tokens = routed.hit_tokens
    for result in routed.per_replica.values():
        as_routed.request_hits.update(result.request_hits)
    answered = plan.observed.get("answered")
    hit: HitRate | None = plan.observed.get("hit")
    observed = None if hit is None else hit.rate
    configuration = "each replica at its observed size, each request on the replica that served it"
    check = Fidelity(
        None,
        DEFAULT_POLICY,
        observed,
        on_answered(as_routed, answered),
        configuration=configuration,
        others="routers",
        observed_source="" if hit is None else hit.source,
        answered=None if not answered else (len(answered), routed.requests),
    )
    if check.reproduces is False:
        return replace(check, reasons=tuple(causes(plan, hit)))
    return check


def run_fidelity(plan: ReplayPlan) -> Fidelity:
    """`plan` replayed at its run's observed size and policy, against the run's hit rate."""
    hit: HitRate | None = plan.observed.get("hit")
    observed = None if hit is None else hit.rate
    policy = plan.policy or DEFAULT_POLICY
    size = plan.observed.get("num_blocks")
    if size is None:
        return Fidelity(None, policy, observed, None, ("the run's cache size is unknown (no snapshot says it)",))
    if not plan.requests:
        return Fidelity(size, policy, observed, None, ("no request of the run has a known block chain",))
    if plan.tier_blocks is None and plan.observed.get("tier_events"):
        unknown = "the run had an offload tier (its tier events say so) whose size it did not record"
        return Fidelity(size, policy, observed, None, (unknown,))
    replay = simulate(plan, num_blocks=size, policy=policy, tier_blocks=plan.tier_blocks or 0)
    answered = plan.observed.get("answered")
    check = Fidelity(
        size,
        policy,
        observed,
        on_answered(replay, answered),
        policy_assumed=plan.policy is None,
        pauses_comparable=plan.recorded is not None,
        observed_source="" if hit is None else hit.source,
        answered=None if not answered else (len(answered), replay.requests),
        registers=None if plan.recorded is not None else registers_of(plan.engine),
        engine_assumed=plan.recorded is None and plan.engine is None,
    )
    if check.reproduces is False:
        return replace(check, reasons=tuple(causes(plan, hit)))
    return check


def on_answered(replay: WhatIfResult, answered: list[tuple[str, int]] | None) -> WhatIfResult:
    """The replay over the requests the observed rate counts: those whose responses said what was cached (`answered`:
    (request id, prompt tokens)); all it replayed when the observed rate is not of responses."""
    if not answered:
        return replay
    hits = replay.request_hits
    return replace(
        replay,
        requests=len(answered),
        hit_tokens=sum(hits.get(request_id, 0) for request_id, _ in answered),
        query_tokens=sum(n for _, n in answered),
    )


def causes(plan: ReplayPlan, hit: HitRate | None) -> list[str]:
    """Why the replay of `plan` may miss its run, as far as the data shows: requests it could not replay, and an
    observed rate counted over other traffic than the requests kvobs holds."""
    replayed = sum(r.prompt_tokens for r in plan.requests)
    held = replayed + plan.skipped_prompt_tokens
    found = []
    if plan.skipped:
        found.append(
            f"{plan.skipped:,} of the run's {plan.skipped + len(plan.requests):,} requests had no known block chain "
            f"and were not replayed ({plan.skipped_prompt_tokens:,} of {held:,} prompt tokens)"
        )
    counters = plan.observed.get("counted", hit)  # (the engine's counters, even where the responses are compared)
    if counters is not None and COUNTERS in counters.source and counters.query_tokens:
        counted = counters.query_tokens
        if held < (1 - SAME_TRAFFIC) * counted:
            found.append(
                f"the engine's counters counted {counted:,.0f} prompt tokens looked up in the run, and the requests "
                f"kvobs received hold {held:,} ({held / counted:.0%}): the cache served traffic whose requests never "
                "reached kvobs (spans not exported, sampled, or sent to another instance name)"
            )
        elif held > (1 + SAME_TRAFFIC) * counted and counters is hit:  # (the responses: the replay's own requests)
            found.append(
                f"the scraped counters counted {counted:,.0f} prompt tokens looked up, fewer than the {held:,} the "
                "run's requests hold: they were scraped over part of the run, so the observed rate is of other "
                "requests than the replay's"
            )
    if not found:
        found.append(
            "no cause in the data: the engine's lookup moment or block accounting differs from the replay's "
            f"({REPLAY_WORDS})"
        )
    return found
