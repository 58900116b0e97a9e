"""The steps' wing's door: why each agent step failed or got slow, with its evidence, decided once and read after.

What the rest of kvobs asks of it:
- decide a time range's steps (`step_causes`, what the collector's keeper calls) into verdict records
  (`verdict_records`);
- a session's verdicts, stored where decided and worked out by the same function for the rest, marked so
  (`session_verdicts`, `with_decided`), and a settled session's steps read whole, attributed by nobody again
  (`decided_steps`);
- a range's verdicts, decided / pending / not decided (`range_verdicts`, `slow_steps`);
- one step's story (`step_story`), its verdict typed (`StepVerdict`: the record, its facts, whether decided);
- and the words and limits the pages print beside them.
Outside the wing, code imports this module only (tests/test_architecture.py); the wing's rooms (`attribution`,
`facts`, `latency_parts`, `excess`, `typical`, `causes`, `verdicts`, `story`, ...) import the cache wing's door
(`kvobs.analytics.cache`) and each other.
"""

from kvobs.analytics.steps.attribution import (
    ATTRIBUTION_KINDS,
    SLOW_FACTOR,
    SLOW_MIN_S,
    attribute_steps,
    failure_split,
    failure_summary,
)
from kvobs.analytics.steps.causes import VERDICT_INTERVAL_S, range_verdicts, step_causes
from kvobs.analytics.steps.excess import CAUSE_LABELS
from kvobs.analytics.steps.joins import JOIN_FIXES, JOIN_WORDS, SourceJoin, source_joins
from kvobs.analytics.steps.pauses import (
    default_ttls,
    loss_tools,
    not_measured,
    pin_curve,
    request_tools,
    step_pauses,
)
from kvobs.analytics.steps.response_usage import RESPONSES, response_cached_tokens, responses_hit_rate
from kvobs.analytics.steps.slow import SlowSteps, slow_steps
from kvobs.analytics.steps.step_verdict import StepFacts, StepVerdict
from kvobs.analytics.steps.story import SessionRead, step_story
from kvobs.analytics.steps.verdicts import (
    COST_KINDS,
    DECIDED,
    cost_kind,
    decided_steps,
    session_verdicts,
    verdict_records,
    with_decided,
)

__all__ = [
    "ATTRIBUTION_KINDS",
    "CAUSE_LABELS",
    "COST_KINDS",
    "DECIDED",
    "JOIN_FIXES",
    "JOIN_WORDS",
    "RESPONSES",
    "SLOW_FACTOR",
    "SLOW_MIN_S",
    "VERDICT_INTERVAL_S",
    "SessionRead",
    "SlowSteps",
    "SourceJoin",
    "StepFacts",
    "StepVerdict",
    "attribute_steps",
    "cost_kind",
    "decided_steps",
    "default_ttls",
    "failure_split",
    "failure_summary",
    "not_measured",
    "pin_curve",
    "loss_tools",
    "request_tools",
    "range_verdicts",
    "response_cached_tokens",
    "responses_hit_rate",
    "session_verdicts",
    "slow_steps",
    "source_joins",
    "step_causes",
    "step_pauses",
    "step_story",
    "verdict_records",
    "with_decided",
]
