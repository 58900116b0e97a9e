"""The recompute tax: of the prompt tokens an engine prefilled, the share it had computed before and computed again,
split by why (vLLM's RFC on preemption costs names it).

    table = shortfall(lookups, "instance")                               # `shortfall_split`, per instance and fleet
    preempted = preemption_recompute(store.reads.kv_events(since, until, kinds=PREEMPTION_KINDS), counted)
    tax = tax_table(table, "instance", preempted.by("instance"))    # `TAX_COLUMNS`

Counted in the shortfall split's whole prompt blocks: a request prefills its prompt's blocks less those it found
(`achieved`, the tier's loads included: loaded, not computed); of those, the blocks some replica had stored before
are recomputed (every miss part but `cold`), each by its part: evicted in a tool pause, evicted otherwise
(capacity), held by another replica (routing), invalidated or reset, held yet not found. A preempted request
recomputes what it had computed and did not find again at its re-admission (our engine's `preempted` rows and its
re-admission's `hit`): added to both sides. An engine that publishes no preemption rows (vLLM) says what
preemption cost only where its counter says none happened; else that part is not measured (None), and the tax is
then the lookups' alone, said so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvobs.analytics.cache.routing import FLEET
from kvobs.semconv.reasons import READMISSION
from kvobs.semconv.spans import KVEventKind
from kvobs.store.rollups import MISS_PARTS

PREEMPTION_KINDS = [KVEventKind.PREEMPTED.value, KVEventKind.HIT.value]
# the recomputed parts: each miss part but the cold one (first computed there), then preemption
CAUSES = {part: f"{part}_tokens" for part in MISS_PARTS if part != "cold"}
TAX_COLUMNS = [
    "prefill_tokens",
    "recomputed_tokens",
    "recompute_tax",
    *(f"recomputed_{cause}_tokens" for cause in CAUSES),
    "recomputed_preempted_tokens",
]


@dataclass(frozen=True)
class Preemptions:
    """Per request, the tokens a preemption made it recompute (`requests`: request_id, session_id, instance,
    tokens); `measured`: instance -> whether its preemptions' recompute is known (False: counted, not said)."""

    requests: pd.DataFrame
    measured: dict[str, bool]

    def by(self, key: str, keys=None, served: dict | None = None) -> dict[str, float | None]:
        """Tokens per value of `key` (`instance`, `session_id`), and over all of them under `FLEET`; None where
        one of its instances is not measured. `keys`: the values to answer for (one with no preemption: 0);
        `served`: value -> the instances its requests ran on (a session's: so one on an engine that does not say
        its preemptions is not measured, preempted or not)."""
        frame = self.requests
        out: dict[str, float | None] = {}
        for name in keys if keys is not None else frame[key].dropna().unique():
            mine = frame[frame[key] == name]
            instances = {name} if key == "instance" else {*mine["instance"], *(served or {}).get(name, ())}
            known = all(self.measured.get(str(i), False) for i in instances)
            out[str(name)] = float(mine["tokens"].sum()) if known else None
        known = all(value is not None for value in out.values())
        out[FLEET] = float(frame["tokens"].sum()) if known else None
        return out


def preemption_recompute(events: pd.DataFrame, counted: dict[str, float] | None = None) -> Preemptions:
    """From `events` (`PREEMPTION_KINDS` rows): per preempted request, the tokens it lost less those its
    re-admissions found again. An instance that published `hit` rows (our engine) is measured; any other is measured
    only where `counted` (instance -> preemptions its counter counted in the range) says 0."""
    counted = counted or {}
    measured = {str(i): n == 0 for i, n in counted.items()}
    columns = ["request_id", "session_id", "instance", "tokens"]
    if events.empty:
        return Preemptions(pd.DataFrame(columns=columns), measured)
    for instance in events.loc[events["kind"] == KVEventKind.HIT.value, "instance"].unique():
        measured[str(instance)] = True  # an engine that says its lookups says its preemptions
    lost = events[events["kind"] == KVEventKind.PREEMPTED.value]
    found = events[(events["kind"] == KVEventKind.HIT.value) & (events["reason"] == READMISSION)]
    if lost.empty:
        return Preemptions(pd.DataFrame(columns=columns), measured)
    keys = ["request_id", "session_id", "instance"]
    lost_tokens = lost.groupby(keys, dropna=False)["num_tokens"].sum()
    found_tokens = found.groupby("request_id")["num_tokens"].sum()
    rows = lost_tokens.reset_index()
    refound = rows["request_id"].map(found_tokens).fillna(0.0).astype(float)
    rows["tokens"] = np.maximum(rows["num_tokens"].astype(float) - refound, 0.0)
    return Preemptions(rows[columns], measured)


def tax_table(table: pd.DataFrame, by: str, preempted: dict[str, float | None]) -> pd.DataFrame:
    """Per row of a shortfall table (`shortfall_split.shortfall(lookups, by)`): the tokens prefilled, those
    recomputed and their share, by cause (`TAX_COLUMNS`); `preempted`: `Preemptions.by(by)` (None: not measured,
    left out of both sides and shown as None)."""
    rows = []
    for _, row in table.iterrows():
        name = str(row[by])
        parts = {cause: float(row[column]) for cause, column in CAUSES.items()}
        preemption = preempted.get(name, 0.0)
        added = preemption or 0.0
        prefill = float(row["prompt_block_tokens"]) - float(row["achieved_tokens"]) + added
        recomputed = sum(parts.values()) + added
        rows.append(
            {
                by: row[by],
                "prefill_tokens": int(prefill),
                "recomputed_tokens": int(recomputed),
                "recompute_tax": recomputed / prefill if prefill else np.nan,
                **{f"recomputed_{cause}_tokens": int(tokens) for cause, tokens in parts.items()},
                "recomputed_preempted_tokens": None if preemption is None else int(preemption),
            }
        )
    return pd.DataFrame(rows, columns=[by, *TAX_COLUMNS])


def tax_words(row: pd.Series) -> str:
    """One row of `recompute_tax` in words: its share, its largest causes, and what is not measured."""
    if not row["prefill_tokens"]:
        return "nothing prefilled in whole blocks"
    causes = {cause: row[f"recomputed_{cause}_tokens"] for cause in [*CAUSES, "preempted"]}
    named = {"pause": "tool pauses", "routed": "routing", "invalidated": "invalidation or reset"}
    shown = [
        f"{named.get(cause, cause)} {int(tokens):,}"
        for cause, tokens in sorted(causes.items(), key=lambda item: -_known(item[1]))
        if _known(tokens)
    ]
    said = (
        f"{row['recompute_tax']:.1%} of {int(row['prefill_tokens']):,} prefilled tokens were recomputed "
        f"({int(row['recomputed_tokens']):,}{': ' + ', '.join(shown) if shown else ''})"
    )
    if pd.isna(row["recomputed_preempted_tokens"]):
        said += "; preemption's recompute not measured (the engine does not say what a preemption recomputed)"
    return said


def _known(tokens) -> float:
    return 0.0 if tokens is None or pd.isna(tokens) else float(tokens)
