"""One step's verdict, typed: the record its keeper stores (`kvobs.store.rows.StepVerdictRecord`), whether a keeper
decided it, and what the attribution found beside it (`StepFacts`: the record's `detail`), which a step's story
and the step page read.

    verdict = StepVerdict.of_record(record, decided=True)   # a stored record (its facts from its `detail`)
    verdict.record.slow_cause, verdict.facts.prefill_rate, verdict.value("new_prefill_s")
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

import pandas as pd

from kvobs.store.rows import StepVerdictRecord


@dataclass(frozen=True)
class StepFacts:
    """`attribute_steps`' columns beside the record's: the step's times, its request and replica, what the KV record
    counted (blocks lost in the pause, routed tokens, preemptions), its typical parts, the prefill rate, and its
    excess by part. Counts are numbers as the frame holds them; None where not known."""

    e2e_s: float | None = None
    ttft_s: float | None = None
    response_id: str | None = None
    request_join: str | None = None
    instance: str | None = None
    blocks_lost_in_pause: float | None = None
    tokens_lost_in_pause: float | None = None
    routed_tokens: float | None = None
    routed_from: str | None = None
    preemptions: float | None = None
    preemption: str | None = None
    invalidation_reasons: str | None = None
    max_queue_s: float | None = None
    never_scheduled: bool | None = None
    cached_tokens: float | None = None
    new_prefill_s: float | None = None
    decoded_tokens: float | None = None
    typical_queue_s: float | None = None
    typical_prefill_s: float | None = None
    typical_decode_s: float | None = None
    typical_tool_s: float | None = None
    typical_before_s: float | None = None
    typical_other_s: float | None = None
    typical_tpot_s: float | None = None
    prefill_rate: float | None = None
    queue_excess_s: float | None = None
    preempted_excess_s: float | None = None
    lost_excess_s: float | None = None
    invalidated_excess_s: float | None = None
    routed_excess_s: float | None = None
    prefill_excess_s: float | None = None
    cold_excess_s: float | None = None
    slow_decode_excess_s: float | None = None
    decode_excess_s: float | None = None
    tool_excess_s: float | None = None
    before_excess_s: float | None = None
    other_excess_s: float | None = None
    dominant: str | None = None

    @classmethod
    def of_json(cls, detail: str | None) -> StepFacts:
        """The facts a stored record's `detail` holds (none: every fact unknown)."""
        known = json.loads(detail) if detail else {}
        return cls(**{name: known.get(name) for name in FACTS})


FACTS = tuple(f.name for f in fields(StepFacts))


@dataclass(frozen=True)
class StepVerdict:
    """A step's verdict record, its facts, and whether a keeper decided it (else worked out as the page opened)."""

    record: StepVerdictRecord
    facts: StepFacts
    decided: bool

    def value(self, column: str):
        """One of `attribute_steps`' columns by its name, from the record or the facts."""
        return getattr(self.facts, column) if column in FACTS else getattr(self.record, column)

    @classmethod
    def of_record(cls, record: StepVerdictRecord, *, decided: bool) -> StepVerdict:
        return cls(record, StepFacts.of_json(record.detail), decided)


def facts_json(row: Mapping) -> str:
    """A row's facts (`FACTS`, those it has) as the record's `detail`: missing values as null, plain numbers."""
    return json.dumps({name: plain(row[name]) for name in FACTS if name in row}, allow_nan=False)


def plain(value):
    """A frame's cell as plain Python: a numpy scalar as its value, a missing one (None, NaN, pd.NA) as None."""
    if hasattr(value, "item"):  # a numpy scalar
        value = value.item()
    if value is None or value is pd.NA or isinstance(value, float) and math.isnan(value):
        return None
    return value
