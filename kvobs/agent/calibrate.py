"""Fit the agent workload to the machine it runs on: `kvobs demo` and `kvobs agents` measure the server once, as a
round will load it, and choose the step deadline (and, when that would be very long, fewer sessions at once) from
what they measured, so a slow or busy machine shows slow steps with their causes, not a wall of timeouts.

    fit = fit_workload(lambda n: measure_first_steps(base_url, n, max_tokens), concurrency=4, deadline_s=None, ...)
    print(fit.said)             # what was measured, what was chosen, and why
    config = replace(config, step_deadline_s=fit.step_deadline_s, concurrency=fit.concurrency)

A deadline or a concurrency the user gave is kept: the fit then only says whether the deadline leaves room.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CONCURRENCY = 4  # agent sessions at once, unless told or the machine is too slow for it (kvobs demo)
LATER_STEPS_ROOM = 3.0  # a later step carries the session's grown context: about this many first steps' time
TOO_TIGHT_ROOM = 2.0  # a given deadline under this many first steps' time fails steps for the machine, not the cache
SMALLEST_DEADLINE_S = 20.0  # on a fast machine: the demo's deadline of old, which makes a lost prefix visible
LONGEST_FITTED_DEADLINE_S = 120.0  # above this, fewer sessions at once rather than minutes a step
ROUND_TO_S = 5


@dataclass(frozen=True)
class Measurement:
    """`concurrency` first steps sent at once: the slowest one's end-to-end time and its prompt tokens."""

    concurrency: int
    slowest_s: float
    prompt_tokens: int
    max_tokens: int

    def said(self) -> str:
        return (
            f"{self.concurrency} first steps at once ({self.prompt_tokens} prompt tokens and {self.max_tokens} reply "
            f"tokens each) took up to {self.slowest_s:.1f} s on this machine"
        )


@dataclass(frozen=True)
class Fit:
    step_deadline_s: float
    concurrency: int
    said: str  # one paragraph: what was measured, what was chosen, and why
    measurements: tuple[Measurement, ...]
    too_tight: bool = False  # a given deadline that will fail steps for the machine's speed


def fitted_deadline(slowest_s: float) -> float:
    """The deadline a round needs after first steps took `slowest_s`: room for the later, longer steps, rounded up."""
    return float(max(SMALLEST_DEADLINE_S, ROUND_TO_S * math.ceil(slowest_s * LATER_STEPS_ROOM / ROUND_TO_S)))


def fit_workload(
    measure_at: Callable[[int], Measurement],
    *,
    concurrency: int,
    deadline_s: float | None,
    concurrency_given: bool,
    flag: str = "--step-deadline-s",
) -> Fit:
    """Measure at `concurrency` and choose: a given `deadline_s` is kept (said too tight when it is); else the fitted
    deadline, and when that passes `LONGEST_FITTED_DEADLINE_S` and the concurrency was not given, fewer sessions at
    once, measured again."""
    first = measure_at(concurrency)
    if deadline_s is not None:
        tight = first.slowest_s * TOO_TIGHT_ROOM > deadline_s
        if not tight:
            return Fit(deadline_s, concurrency, f"{first.said()}: within {flag} {deadline_s:g}", (first,))
        said = (
            f"{first.said()}, and later steps are longer: {flag} {deadline_s:g} will fail many steps for the "
            f"machine's speed, not the cache. Without the flag it is fitted to the machine "
            f"({fitted_deadline(first.slowest_s):g} s here)."
        )
        return Fit(deadline_s, concurrency, said, (first,), too_tight=True)
    deadline = fitted_deadline(first.slowest_s)
    if deadline <= LONGEST_FITTED_DEADLINE_S or concurrency_given or concurrency == 1:
        return Fit(deadline, concurrency, _chosen(first, deadline, flag), (first,))
    # On a CPU the sessions at once share its cores: a step's time grows about with their number.
    fewer = max(1, math.floor(concurrency * LONGEST_FITTED_DEADLINE_S / deadline))
    second = measure_at(fewer)
    deadline = fitted_deadline(second.slowest_s)
    said = (
        f"{first.said()}: a round at that concurrency would need a step deadline of "
        f"{fitted_deadline(first.slowest_s):g} s, so it runs {fewer} sessions at once (--concurrency overrides). "
        + _chosen(second, deadline, flag)
    )
    return Fit(deadline, fewer, said, (first, second))


def _chosen(measured: Measurement, deadline: float, flag: str) -> str:
    return (
        f"{measured.said()}; a later step carries a longer context, so the step deadline is {deadline:g} s "
        f"({LATER_STEPS_ROOM:g} x that, rounded up, at least {SMALLEST_DEADLINE_S:g} s; {flag} overrides)"
    )
