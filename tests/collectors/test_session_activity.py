"""Session activity: idle between requests, and spans whose session never shows up are given up, not re-asked."""

from __future__ import annotations

from collectors.session_activity import SessionActivity


def test_idle_between_and_after_requests_not_before_the_first():
    activity = SessionActivity()
    activity.add_request("t1", "a", 10.0, 12.0, session_id="s")
    activity.add_request("t1", "b", 15.0, 18.0, session_id="s")
    assert [activity.is_idle("s", ts) for ts in (5.0, 11.0, 13.0, 16.0, 30.0)] == [False, False, True, False, True]
    assert activity.is_idle("unknown", 11.0) is None and activity.latest_span["s"] == ("t1", "b")


def test_unresolved_spans_are_resolved_later_or_given_up_after_their_ttl():
    now = [0.0]
    asked: list[list[str]] = []
    known = {}

    def resolve(trace_ids):
        asked.append(sorted(trace_ids))
        return {t: known[t] for t in trace_ids if t in known}

    activity = SessionActivity(resolve, unresolved_ttl_s=60, clock=lambda: now[0])
    activity.add_request("late", "x", 1.0, 2.0)
    activity.add_request("never", "y", 1.0, 2.0)
    activity.resolve_pending()
    known["late"] = "s"  # the SDK wrote the step after its tool call
    now[0] = 30.0
    activity.resolve_pending()
    assert activity.is_idle("s", 3.0) is True
    now[0] = 61.0
    activity.resolve_pending()  # "never" is asked one last time, then dropped
    activity.resolve_pending()
    assert asked == [["late", "never"], ["late", "never"], ["never"]]
