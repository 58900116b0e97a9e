"""Overview: KPIs and the time series of cache pressure, evictions, preemptions, latency and step failures; on a
fleet, one row per instance and one measure as small multiples."""

from __future__ import annotations

import streamlit as st

from dashboard import glossary
from dashboard.data import FLEET_SERIES
from dashboard.page_data import FleetRouting, FleetTable, Overview
from dashboard.verdicts import Failures
from dashboard.views import cache
from dashboard.views.charts import small_multiples, time_chart
from dashboard.views.tables import show_table, show_text_table
from dashboard.views.tier_hits import render_tier_hits
from kvobs.analytics.samples import min_sample
from kvobs.analytics.steps import SLOW_FACTOR, SLOW_MIN_S, SlowSteps
from kvobs.store.latency_sketch import SKETCH_ACCURACY

TITLE = "Overview"
# a fleet's routing loss is analysed as the page opens for a range of up to this many KV events (about 0.5 s:
# bench/dashboard_queries.py, the routing row), beyond that when asked
AUTO_ROUTING_EVENTS = 50_000


def _kpis(kpis: dict, routing: FleetRouting | None = None) -> list[tuple[str, str, str]]:
    """(label, value, what it counts) of each KPI, as shown; with `routing` (`data.fleet_routing`), the fleet's
    routing loss."""
    hit, (ttft, n) = kpis["hit rate"], kpis["TTFT p90 (s)"]
    need = min_sample(0.9)
    fleet = []
    if routing is not None and not routing.summary.empty:
        row = routing.summary.iloc[-1]
        share, per_s = float(row["routed_share"]), float(row["routed_tokens_per_s"])
        fleet = [
            (
                "routing loss",
                f"{share:.1%}",
                f"Prompt tokens recomputed on their replica while another replica held them ({per_s:,.1f} tokens/s), "
                "of the prompt tokens of the requests compared; per instance below.",
            )
        ]
    return [
        ("requests", f"{kpis['requests']:,}", "LLM requests that arrived in the range."),
        (
            "agent steps",
            f"{kpis['agent steps']:,}",
            "Agent steps that started in the range: the fleet's, whatever instances are chosen.",
        ),
        ("failed steps", f"{kpis['failed steps']:,}", "Agent steps that ended in an error (any error type)."),
        (
            "hit rate",
            "-" if hit.rate is None else f"{hit.rate:.1%}",
            "Prefix-cache hit rate: prompt tokens served "
            f"from the prefix cache / prompt tokens ({hit.describe()}, from the {hit.source}), as in the terminal "
            "and on the What-if page.",
        ),
        (
            "blocks lost",
            f"{kpis['blocks lost']:,}",
            "Cached blocks the cache took from a session that still wanted them: evicted for room, invalidated, "
            "removed (each lost block once; resets and releases not included).",
        ),
        (
            "released",
            f"{kpis['blocks released']:,}",
            "Cached blocks the agents released themselves (their session ended): no loss, counted apart.",
        ),
        (
            "preemptions",
            "-" if kpis["preemptions"] is None else f"{kpis['preemptions']:,}",
            "Increase of the instances' preemption counters over the range.",
        ),
        (
            "TTFT p90 (s)",
            "-" if ttft != ttft else f"{ttft:.2f}",
            f"90th percentile time to first token of the {n:,} requests in the range, read off a latency sketch "
            f"(within {SKETCH_ACCURACY:.0%} of the exact value)"
            + (f" (not shown under {need}: too few to speak of a p90)." if n < need else "."),
        ),
        *fleet,
    ]


def render(ctx) -> None:
    st.header(TITLE)
    per_instance = len(ctx.shown_instances) > 1
    data = cache.overview(ctx.url, ctx.since, ctx.until, ctx.window_s, ctx.instances, per_instance=per_instance)
    routing = None
    if per_instance:  # measured by a collector: read whatever the range; else replayed up to a size, or when asked
        replay = data.num_kv_events <= AUTO_ROUTING_EVENTS or bool(st.session_state.get("routing_asked"))
        routing = cache.fleet_routing(ctx.url, ctx.since, ctx.until, ctx.instances, replay=replay)
    shown = _kpis(data.kpis, routing)
    for col, (name, value, help_text) in zip(st.columns(len(shown)), shown):
        col.metric(name, value, help=help_text)
    ctx.runs_note()
    st.caption(
        ctx.window_caption() + " Blocks lost: each lost block once (evictions, invalidations, vLLM removals; "
        "a block several sessions owned counts once; resets and the agents' releases not included), as on the What-if "
        "page."
    )
    axis = ctx.axis
    no_snaps = glossary.MISSING["snapshots"]
    left, right = st.columns(2)
    with left:
        st.subheader("KV cache usage")
        time_chart(data.usage, axis, y_title="pinned KV usage", y_format="%", empty=no_snaps)
        st.subheader("Resident cached blocks")
        no_resident = (
            "The instances report no resident cached blocks (vLLM's /metrics has no such gauge; its KV "
            "events do, on the KV events page)."
            if data.num_snapshots
            else no_snaps
        )
        time_chart(data.resident, axis, y_title="blocks", empty=no_resident)
    with right:
        st.subheader("Prefix-cache hit rate")
        no_hits = "No prompt tokens were queried in this range."
        time_chart(data.hit_rate, axis, y_title="cached / prompt tokens", y_format="%", empty=no_hits)
        st.subheader("Blocks lost per second, by reason")
        unknown = "Losses are unknown here. " + glossary.MISSING["kv_events"]
        time_chart(
            data.evictions,
            axis,
            y_title="blocks / s",
            mark="area",
            zero_is_empty=True,
            empty="No block was lost in this range." if data.watching_kv else unknown,
        )
    left, right = st.columns(2)
    with left:
        st.subheader("Time to first token")
        _latency(ctx, data)
        st.subheader("Preemptions")
        time_chart(
            data.preemptions,
            axis,
            y_title="preemptions / window",
            mark="bar",
            window_s=ctx.window_s,
            zero_is_empty=True,
            empty=f"No preemptions in this range ({data.num_snapshots:,} instance snapshots)."
            if data.num_snapshots
            else no_snaps,
        )
    with right:
        st.subheader("Agent steps and failures")
        no_steps = glossary.MISSING["steps"]
        drawn = time_chart(
            data.steps, axis, y_title="steps / window", mark="bar", window_s=ctx.window_s, empty=no_steps
        )
    if drawn and data.kpis["failed steps"]:
        st.subheader("Failed steps by cause")
        failures = cache.failures(ctx.url, ctx.since, ctx.until)
        st.caption(
            "Model and request errors are theirs; only a timeout is given the KV or queue cause that cost it "
            "time. The evidence is that of the latest step of each cause. " + verdict_words(failures)
        )
        table = failures.table
        table = table.assign(story=[f"[open]({url})" for url in table["story"]])
        show_text_table(
            table[["failure_kind", "failure_cause", "failed_steps", "share", "example", "evidence", "story"]], ctx.clock
        )
    if drawn:
        _slow_steps(ctx)
    render_tier_hits(ctx)
    if per_instance:
        render_fleet(ctx, data.fleet)
        render_routing(ctx, routing)


def verdict_words(failures: Failures) -> str:
    """Where the failure table's verdicts come from: decided by the collector once each session settled, pending
    (timeouts of sessions still running, which a running collector decides once they settle), or worked out as the
    page opened (not decided yet: model and request errors of sessions still running, or no collector deciding)."""
    failed, decided, pending = failures.failed, failures.decided, failures.pending
    worked = failed - decided - pending
    if decided == failed:
        return f"All {failed:,} verdicts were decided once their session had settled."
    if worked == failed:
        return f"The {failed:,} verdicts were worked out as this page opened (no collector decided them yet)."
    parts = [f"{decided:,} of {failed:,} verdicts were decided once their session had settled"] if decided else []
    if pending:
        parts.append(
            f"{pending:,} timeouts of sessions still running are pending: the collector decides them once their "
            "session settles, and until then their KV record may still change"
        )
    if worked:
        parts.append(f"{worked:,} were worked out as this page opened (no collector decided them yet)")
    return "; ".join(parts) + "."


def _slow_steps(ctx) -> None:
    st.subheader("Slow steps by cause")
    slow = cache.slow_steps(ctx.url, ctx.since, ctx.until)
    st.caption(
        f"A step is slow when it took more than {SLOW_FACTOR} times its session's typical step (and {SLOW_MIN_S} s "
        "more); its cause is "
        "the part of its time furthest over its typical value. " + slow_words(slow)
    )
    if len(slow.table):
        table = slow.table.assign(
            example=[f"{s} step {i}" for s, i in zip(slow.table["session_id"], slow.table["step_index"])],
            story=[f"[open]({url})" for url in slow.table["story"]],
        )
        show_text_table(
            table[["slow_cause", "slow_steps", "of_weighed", "slow_s", "example", "evidence", "story"]], ctx.clock
        )


def slow_words(slow: SlowSteps) -> str:
    """What the slow table counts, and what it leaves out: steps pending, steps no collector decided (never shown as
    "not slow")."""
    parts = [
        f"Of {slow.steps:,} steps, {slow.decided:,} were decided once their session had settled"
        + (f"; {slow.weighed:,} of them had a request to weigh, and {slow.slow:,} were slow" if slow.decided else "")
    ]
    if slow.pending:
        parts.append(f"{slow.pending:,} of sessions still running are pending: the collector decides them once settled")
    if slow.undecided:
        parts.append(
            f"{slow.undecided:,} were not decided by a collector and are not counted here: the Sessions page works "
            "a session's steps out when it is opened"
        )
    return "; ".join(parts) + "."


def _latency(ctx, data: Overview) -> None:
    """Each request's TTFT as a dot (up to `MAX_POINTS` requests), and each window's p50 and p90 where the window has
    enough requests for them (5 and 10)."""
    points = data.ttft_points
    dots = None if points is None else points.set_index("arrival_ts")["ttft_s"].rename("request's TTFT")
    latency = data.latency
    drawn = time_chart(latency, ctx.axis, y_title="seconds", points=dots, empty=glossary.MISSING["requests"])
    if drawn:
        lines = bool(latency.notna().any().any()) if not latency.empty else False
        st.caption(
            ("Dots: each request's time to first token, at its arrival. " if dots is not None else "")
            + (
                "Lines: each window's p50 and p90, where the window holds 5 and 10 requests or more (read off a "
                f"latency sketch, within {SKETCH_ACCURACY:.0%} of the exact values)."
                if lines
                else "No window holds the 5 requests a p50 needs, so no percentile is drawn."
            )
        )


def render_fleet(ctx, data: FleetTable) -> None:
    """Per instance: a row each (most blocks lost first), then one measure as small multiples."""
    st.subheader("Per instance")
    st.caption(
        f"{ctx.scope().capitalize()}, most blocks lost first. Requests come from each instance's traces "
        "(`service.instance.id`), snapshots from its /metrics, losses from its KV-event stream; a blank: that "
        "source reported nothing for the instance in this range."
    )
    show_table(data.table, ctx.clock)
    measure = st.selectbox(
        "Measure, per instance", list(FLEET_SERIES), key="fleet_measure", format_func=lambda c: FLEET_SERIES[c][0]
    )
    title, unit, fmt = FLEET_SERIES[measure]
    frame = data.series[measure]
    silent = [name for name in data.table["instance"] if name not in frame.columns]
    small_multiples(
        frame, ctx.axis, y_title=unit, y_format=fmt, empty=f"No instance reported {title.lower()} in this range."
    )
    if silent and not frame.empty:
        st.caption(f"No {title.lower()} from: {', '.join(silent)} (their source did not report it; unknown, not 0).")


def render_routing(ctx, data: FleetRouting | None) -> None:
    """Routing loss: prompt tokens recomputed on a request's replica while another replica held them. A range of more
    than `AUTO_ROUTING_EVENTS` KV events is analysed when asked (its cost grows with them)."""
    st.subheader("Routing loss")
    if data is None:
        st.info(
            "No collector measured this range's lookups (a collector measures each request as it goes, which any "
            "range then reads at once). Without them, the routing loss replays every KV event of the range in time "
            "order (about 10 s for a million on SQLite on 2 cores): a "
            f"range of up to {AUTO_ROUTING_EVENTS:,} events is analysed as the page opens, a larger one when asked."
        )
        if st.button("Analyse the routing loss of this range", key="routing_go"):
            st.session_state["routing_asked"] = True
            st.rerun()
        return
    summary, compared = data.summary, data.compared
    what = (
        "Prompt tokens a request recomputed on its replica while another replica of the fleet held that prefix at "
        "its lookup (from the replicas' KV events): what a KV-aware router would have found."
    )
    if data.source == "measured":
        st.caption(
            f"{what} Measured by the collector, each request once, a few minutes after its lookup; read from the "
            "store's per-minute rollup. Share: of the prompt tokens of the requests compared with another replica "
            f"({compared:,} of the {data.requests:,} whose hash chain was known); tokens/s over the span "
            f"measured, {ctx.clock.iso(data.measured_from)} to {ctx.clock.iso(data.measured_to)}."
        )
        if data.pending:
            st.info(
                f"Pending: {data.pending:,} request(s) arrived after {ctx.clock.iso(data.measured_to)}, "
                "where the collector has measured so far; it measures each about three minutes after its "
                "lookup, when its blocks have reached the store. Not counted here yet."
            )
        if data.unmeasured:
            st.warning(
                f"No collector measures the lookups of {', '.join(data.unmeasured)}: their requests are not in "
                "these tables (a collector measures the replicas whose KV events it takes)."
            )
    else:
        st.caption(
            f"{what} Replayed from the range's KV events as the page opened. Share: of the prompt tokens of the "
            f"requests compared ({compared:,} of {data.requests:,} in the range; a request is compared when its "
            "hash chain, root included, is known)."
        )
    for note in data.notes:
        st.warning(note)
    if summary.empty:
        st.info("No request could be compared with another replica in this range.")
    else:
        show_table(summary, ctx.clock)
    render_shortfall(ctx, data)


def render_shortfall(ctx, data: FleetRouting) -> None:
    """Available vs achieved hit rate per instance and for the fleet, the gap split by why each block missed."""
    st.subheader("Hit-rate shortfall, split")
    table, spread = data.shortfall, data.spread
    st.caption(
        "In whole prompt blocks of the requests whose hash chain is known: achieved = found on the request's own "
        "replica, in its cache or loaded from a lower tier (the tier's share shown apart); available = what a "
        "cache that never evicted would have held at the lookup (every block some replica had stored before). "
        "Each missed block is counted once, by why: another replica held it "
        "(routing), never stored before (cold), invalidated or reset, evicted while the session waited on a tool "
        "(tool pause), evicted otherwise (capacity), held yet not found (unexplained). The parts add up to the "
        "prompt's whole blocks."
    )
    if table.empty:
        st.info("No request's hash chain is known in this range (it needs the replicas' KV events).")
        return
    show_table(table, ctx.clock)
    if spread["max"] is not None:
        st.caption(
            f"Achieved hit rate across the {spread['replicas']} replicas: highest {spread['max']:.1%}, mean "
            f"{spread['mean']:.1%}, standard deviation {spread['stddev']:.1%}."
        )
    if data.tax is not None and not data.tax.empty:
        st.markdown("**Recompute tax**")
        show_table(data.tax, ctx.clock)
        st.caption(
            "Of the prompt tokens prefilled (whole blocks, less those found), the share computed before and "
            "computed again, by why: the shortfall's parts but the cold one, and what a preemption made a request "
            "recompute (its lost tokens less those its re-admission found again). An engine that does not say what "
            "its preemptions recomputed (vLLM) shows that part empty: not measured, and the tax is then the "
            "lookups' alone."
        )
