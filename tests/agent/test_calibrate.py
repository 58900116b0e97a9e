"""Fitting the agent workload to the machine (`kvobs.agent.calibrate`): the step deadline from the first steps'
measured time, fewer sessions at once where that deadline would be minutes, a deadline or a concurrency the user gave
kept, and what was chosen said with why. The measurement itself is the real one, against the real engine."""

from __future__ import annotations

import pytest

from kvobs.agent.calibrate import (
    LATER_STEPS_ROOM,
    LONGEST_FITTED_DEADLINE_S,
    SMALLEST_DEADLINE_S,
    Measurement,
    fit_workload,
    fitted_deadline,
)
from kvobs.agent.workload import measure_first_steps
from tests.server.conftest import running_server


def machine(seconds_per_session: float):
    """A machine whose first steps take `seconds_per_session` x the sessions at once (a CPU's cores shared), and the
    concurrencies it was measured at."""
    asked: list[int] = []

    def measure_at(concurrency: int) -> Measurement:
        asked.append(concurrency)
        return Measurement(concurrency, seconds_per_session * concurrency, 194, 32)

    return measure_at, asked


def test_a_fast_machine_keeps_the_smallest_deadline_and_its_concurrency():
    measure_at, asked = machine(0.5)
    fit = fit_workload(measure_at, concurrency=4, deadline_s=None, concurrency_given=False)
    assert (fit.step_deadline_s, fit.concurrency, asked) == (SMALLEST_DEADLINE_S, 4, [4])
    assert "took up to 2.0 s" in fit.said and f"the step deadline is {SMALLEST_DEADLINE_S:g} s" in fit.said


def test_a_slow_machine_gets_a_deadline_with_room_for_the_later_steps():
    measure_at, asked = machine(4.4)  # 17.6 s for 4 first steps: the busy 2-core VM of the issue
    fit = fit_workload(measure_at, concurrency=4, deadline_s=None, concurrency_given=False)
    assert fit.step_deadline_s == 55.0 == fitted_deadline(17.6) >= 17.6 * LATER_STEPS_ROOM
    assert fit.concurrency == 4 and asked == [4] and not fit.too_tight
    assert "17.6 s" in fit.said and "the step deadline is 55 s" in fit.said
    assert "--step-deadline-s overrides" in fit.said


def test_a_machine_too_slow_for_its_concurrency_runs_fewer_sessions_measured_again():
    measure_at, asked = machine(15.0)  # 60 s for 4 at once: a deadline of 180 s
    fit = fit_workload(measure_at, concurrency=4, deadline_s=None, concurrency_given=False)
    assert asked == [4, 2] and fit.concurrency == 2
    assert fit.step_deadline_s == fitted_deadline(30.0) <= LONGEST_FITTED_DEADLINE_S
    assert "runs 2 sessions at once (--concurrency overrides)" in fit.said and len(fit.measurements) == 2


def test_a_concurrency_given_is_kept_however_long_the_deadline():
    measure_at, asked = machine(15.0)
    fit = fit_workload(measure_at, concurrency=4, deadline_s=None, concurrency_given=True)
    assert asked == [4] and fit.concurrency == 4 and fit.step_deadline_s == fitted_deadline(60.0) == 180.0


@pytest.mark.parametrize(("deadline", "tight"), [(20.0, True), (60.0, False)])
def test_a_deadline_given_is_kept_and_said_too_tight_when_it_is(deadline, tight):
    measure_at, _ = machine(4.4)
    fit = fit_workload(measure_at, concurrency=4, deadline_s=deadline, concurrency_given=False)
    assert fit.step_deadline_s == deadline and fit.concurrency == 4 and fit.too_tight is tight
    if tight:
        assert f"--step-deadline-s {deadline:g} will fail many steps for the machine's speed" in fit.said
        assert "(55 s here)" in fit.said
    else:
        assert f"within --step-deadline-s {deadline:g}" in fit.said


@pytest.mark.slow
def test_the_measurement_sends_first_steps_at_once_to_a_real_engine(smollm2_source):
    with running_server(smollm2_source) as server:
        measured = measure_first_steps(server.url, 2, 4)
    assert measured.concurrency == 2 and measured.max_tokens == 4
    assert measured.slowest_s > 0 and measured.prompt_tokens > 100  # the agents' opening prompt


def test_the_workload_defaults_load_without_the_sdk():
    """`kvobs demo --help` and `kvobs agents --help` read the default concurrency from `kvobs.agent.calibrate`: it
    loads neither the SDK (spans, the store) nor the workload; the package's names still load on first use."""
    import subprocess
    import sys

    code = (
        "import sys, kvobs.agent.calibrate, kvobs.agent as a\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('kvobs.agent.', 'kvobs.store', 'opentelemetry')))\n"
        "print(loaded)\n"
        "print(sorted(name for name in a.__all__ if getattr(a, name) is not None))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "['kvobs.agent.calibrate']"
    assert out[1] == str(sorted(__import__("kvobs.agent").agent.__all__))
