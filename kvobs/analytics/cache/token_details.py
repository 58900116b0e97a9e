"""Do the agents' replies say what was cached? vLLM puts `usage.prompt_tokens_details.cached_tokens` in a reply only
when started with `--enable-prompt-tokens-details` (off by default), so a fleet on its defaults answers every step
with its prompt tokens and no cached tokens: each step's hits are then not measured from its reply (shown unknown,
never 0), and only the KV events and the server's own spans tell them.

    check = token_details_check(store, since, until)   # None when no step read its reply's usage

Counted on the SDK's steps alone (no `request_join`): the SDK read their usage from the reply itself, so a missing
count is the reply's. A step made of a framework's spans may lack it because its instrumentation does not record it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvobs.semconv.spans import CachedFill
from kvobs.store.interface import Store

FIX = "start vLLM with --enable-prompt-tokens-details (kvobs serve sends them unless --no-prompt-tokens-details)"


@dataclass(frozen=True)
class TokenDetailsCheck:
    answered: int  # SDK steps whose reply gave its prompt tokens
    without: int  # of those, replies with no cached tokens

    @property
    def ok(self) -> bool:
        return self.without == 0

    @property
    def words(self) -> str:
        if self.ok:
            return f"every one of {self.answered} answered steps' replies said how many prompt tokens were cached"
        return (
            f"{self.without} of {self.answered} answered steps' replies carried no cached tokens "
            "(usage.prompt_tokens_details null), so their hits are not measured from the reply (unknown, never 0); "
            f"to fix: {FIX}"
        )


def _answered(join, prompt) -> bool:
    """An SDK step (no collector's join) whose reply gave its prompt tokens."""
    return not isinstance(join, str) and prompt is not None and prompt == prompt


def _without(cached) -> bool:
    return cached is None or cached != cached


def reply_without_details(step) -> str | None:
    """A step's own words where the SDK read its reply's usage and found no cached tokens (None: not so)."""
    if not _answered(step.get("request_join"), step.get("prompt_tokens")) or not _without(step.get("cached_tokens")):
        return None
    return (
        "its reply gave its prompt tokens but no cached tokens (usage.prompt_tokens_details null), so what it hit is "
        f"known only from the server's own record; to fix: {FIX}"
    )


def token_details_check(store: Store, since: float | None, until: float | None) -> TokenDetailsCheck | None:
    """Of the SDK's steps started in the range whose reply gave its prompt tokens, how many gave no cached tokens
    (None: no such step)."""
    steps = store.reads.steps(since, until)
    if steps.empty:
        return None
    rows = zip(steps["request_join"].tolist(), steps["prompt_tokens"].tolist(), steps["cached_tokens"].tolist())
    answered = [cached for join, prompt, cached in rows if _answered(join, prompt)]
    if not answered:
        return None
    return TokenDetailsCheck(len(answered), sum(_without(cached) for cached in answered))


def cached_fill_check(outcomes: Mapping[str, float]) -> tuple[bool, str]:
    """(ok, words) of a collector's `kvobs_collector_requests_cached_filled_total` by outcome: what became of the
    joined requests whose own span said no cached tokens (vLLM's never do). Not ok only where none could take its
    reply's count and some replies had none: the server's prompt-token details are off, the fix is its flag."""
    counts = {outcome: int(n) for outcome, n in outcomes.items() if n}
    filled, without = counts.get(CachedFill.FILLED.value, 0), counts.get(CachedFill.NO_COUNT.value, 0)
    differ = counts.get(CachedFill.COUNTS_DIFFER.value, 0)
    words = (
        f"of {sum(counts.values()):,} joined requests whose own span said no cached tokens, {filled:,} took the "
        "count their step's reply gave"
    )
    if without:
        words += (
            f"; {without:,} stay unknown (never 0): their step's span holds no count (the server's prompt-token "
            "details off, or an instrumentation that keeps none, as the OpenAI Agents SDK's)"
        )
    if differ:
        words += f"; {differ:,} stay unknown: their reply counted other prompt tokens than the request"
    ok = filled > 0 or not without
    return ok, words if ok else f"{words}; to fix: {FIX}"
