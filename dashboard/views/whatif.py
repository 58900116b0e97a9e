"""What-if: replay the range's requests through other cache sizes and policies, run by run, next to what was
observed: a chart of the hit rate and the tool-pause losses by cache size, and the table. A range of up to an hour is
replayed at the default sizes (the observed one among them) as the page opens; a longer one when asked."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboard import glossary
from dashboard.views import cache, whatif_pauses, whatif_tiers
from dashboard.views.charts import show
from dashboard.views.tables import show_text_table
from dashboard.whatif_data import RouterReplay, SizeReplay, router_replay, size_replay
from kvobs.semconv.reasons import EvictionPolicyName, names

TITLE = "What-if"
AUTO_REPLAY_S = 3600.0  # a range up to this long is replayed at the default sizes as the page opens


@st.cache_data(ttl=60, show_spinner="Replaying...")
def replay(url, since, until, instances, sizes: tuple[int, ...], policy: str, ttl_s: float) -> SizeReplay:
    """The range at each size (`dashboard.whatif_data.size_replay`), over the plans built once for the page."""
    plans = cache.replay_plans(url, since, until, instances)
    return size_replay(cache.get_store(url), plans, since, until, instances, sizes, policy, ttl_s)


@st.cache_data(ttl=60, show_spinner="Replaying the routers...")
def replay_routers(url, since, until, prefill_load_scale: float) -> RouterReplay:
    """The fleet's traffic of the range under each router (`dashboard.whatif_data.router_replay`)."""
    return router_replay(cache.get_store(url), since, until, prefill_load_scale)


def _observed_size(ctx) -> int | None:
    """The cache size the range's runs had (blocks, the reserved one included), when they all had the same."""
    runs = ctx.runs
    sizes = set() if runs is None else {int(n) + 1 for n in runs["num_blocks"].dropna()}
    return sizes.pop() if len(sizes) == 1 else None


def render(ctx) -> None:
    st.header(TITLE)
    ctx.runs_note()
    observed = _observed_size(ctx)
    defaults = sorted({max(2, observed // 2), observed, observed * 2, observed * 4}) if observed else [32, 64, 128, 256]
    c1, c2, c3 = st.columns(3)
    policy = c2.selectbox(
        "Policy",
        names(EvictionPolicyName),
        key="whatif_policy",
        help="lru: the least recently used cached block goes first (vLLM's). session_ttl: blocks of a "
        "session paused for less than the TTL are kept while anything else can go.",
    )
    sizes_text = c1.text_input(
        "Cache sizes (blocks)",
        ",".join(map(str, defaults)),
        key="whatif_sizes",
        help=f"Blocks of the engine's block size{'; observed: ' + str(observed) if observed else ''}.",
    )
    ttl_s = 30.0
    if policy == EvictionPolicyName.SESSION_TTL.value:
        ttl_s = c3.number_input(
            "Session TTL (s)",
            min_value=0.0,
            value=30.0,
            key="whatif_ttl",
            help="How long a paused session's blocks are protected.",
        )
    try:
        sizes = tuple(int(s) for s in sizes_text.split(",") if s.strip())
        if not sizes or min(sizes) < 2:
            raise ValueError
    except ValueError:
        st.error(f"Cache sizes must be whole numbers of at least 2, separated by commas; got {sizes_text!r}.")
        return
    clicked = st.button("Replay", key="whatif_go")
    if not clicked and "whatif_ran" not in st.session_state and ctx.until - ctx.since > AUTO_REPLAY_S:
        st.info(
            "Choose sizes and a policy, then Replay." + (f" The runs here had {observed} blocks." if observed else "")
        )
        return
    st.session_state["whatif_ran"] = True
    try:
        done = replay(ctx.url, ctx.since, ctx.until, ctx.instances, sizes, policy, float(ttl_s))
    except ValueError as exc:
        st.warning(str(exc))
        return
    if not done.replayed:  # (KV events alone: the blocks are there, the requests that would replay them are not)
        st.info("Nothing to replay: it replays requests with their block chains. " + glossary.MISSING["requests"])
        return
    per_run, check = done.per_run, done.check
    runs = f"{len(per_run)} runs, each replayed through a cache of its own (a restart empties it); " if per_run else ""
    st.caption(
        f"{runs}{done.replayed:,} requests replayed; {done.skipped:,} without a known block chain skipped."
        + "".join(f" {note}" for note in done.notes)
    )
    _check(check, ctx)
    _chart(done.table, pauses=check.pauses_comparable)
    show_text_table(done.table, ctx.clock)
    if done.pauses_note:
        st.caption(done.pauses_note)
    st.caption(
        "Hit rate: cached prompt tokens / prompt tokens, as on the Overview and in the terminal. Blocks lost: "
        "each lost block once (evictions, invalidations, vLLM removals; resets not included). Lost in tool "
        "pauses: blocks a session lost while it waited on a tool, counted once it came back; the replay knows "
        "each session's last request, so nothing is pending there. Our engine's runs are replayed step for "
        "step, so at the observed size and policy the replay is the run; vLLM's approximately, and the check "
        "above says how closely."
    )
    st.subheader("Time to first token saved")
    show_text_table(done.saved, ctx.clock)
    st.caption(done.saved_words)
    for span, run_table, run_check in per_run:
        with st.expander(span.label(ctx.clock.iso)):
            _check(run_check, ctx)
            show_text_table(run_table, ctx.clock)
    whatif_tiers.render(ctx, observed)
    whatif_pauses.render(ctx)
    if len(ctx.shown_instances) > 1:
        render_routers(ctx)


def render_routers(ctx) -> None:
    """The fleet's traffic of the range under other routers (`kvobs whatif --replicas`)."""
    st.subheader("Routers")
    scale = st.number_input(
        "Prefill load scale (prefix_load)",
        min_value=0.0,
        value=1.0,
        key="whatif_prefill_scale",
        help="Dynamo's KV router: the weight of the blocks a request still needs on a replica against the "
        "replica's active decode blocks.",
    )
    try:
        done = replay_routers(ctx.url, ctx.since, ctx.until, float(scale))
    except ValueError as exc:
        st.warning(str(exc))
        return
    listed = ", ".join(f"{name} {n:,}" for name, n in sorted(done.sizes.items()))
    st.caption(
        f"The fleet's {done.replayed:,} requests of the range ({done.skipped:,} without a known chain skipped), each "
        f"replica at its observed size (blocks: {listed}), under each router through the same replay "
        f"({done.replay_words}), so the rows compare like with like; as_routed replays each request on the replica "
        "that served it. prefix: llm-d's precise prefix-cache scorer (the longest resident prefix, ties by load); "
        "prefix_load: Dynamo's KV router (least prefill load scale x blocks to compute + active decode blocks). "
        "Routing loss: at each lookup, the tokens another replica held beyond the chosen one. max/mean: 1.00 is an "
        "even load."
    )
    _check(done.check, ctx)
    show_text_table(done.table, ctx.clock)


def _check(check, ctx) -> None:
    """The replay's error at the observed point (`whatif.fidelity.Fidelity`): a warning when the curve is no
    evidence, a caption when it reproduces the run."""
    (st.caption if check.reproduces else st.warning)(check.describe(ctx.clock.iso))


def _chart(table: pd.DataFrame, *, pauses: bool) -> None:
    """The hit rate and the tool-pause losses by size, the observed point marked (on the pause chart only where
    the replay counts pause losses as the observed count does: `pauses`)."""
    long = table.melt(
        id_vars=["configuration", "blocks"],
        value_vars=["hit rate", "lost in tool pauses"],
        var_name="measure",
        value_name="value",
    ).dropna(subset=["blocks", "value"])
    if long.empty:
        st.info("No replayed size has a value to chart: the table below says what each one counted.")
        return
    long["observed"] = long["configuration"] == "observed"
    if not pauses:
        long = long[~(long["observed"] & (long["measure"] == "lost in tool pauses"))]
    charts, undrawn = [], []
    for measure, fmt in (("hit rate", "%"), ("lost in tool pauses", ",d")):
        mine = long[long["measure"] == measure]
        if (~mine["observed"]).sum() == 0:  # no replayed point: no chart of bare axes
            undrawn.append(measure)
            continue
        replayed = (
            alt.Chart(mine[~mine["observed"]])
            .mark_line(point=True)
            .encode(
                x=alt.X("blocks:Q", title="cache size (blocks)"),
                y=alt.Y("value:Q", title=measure + (" (blocks)" if fmt == ",d" else ""), axis=alt.Axis(format=fmt)),
                tooltip=["blocks", alt.Tooltip("value:Q", title=measure, format=".1%" if fmt == "%" else ",d")],
            )
        )
        seen = (
            alt.Chart(mine[mine["observed"]])
            .mark_point(shape="diamond", size=160, filled=True, color="#d62728")
            .encode(
                x="blocks:Q",
                y="value:Q",
                tooltip=[alt.Tooltip("value:Q", title=f"observed {measure}", format=".1%" if fmt == "%" else ",d")],
            )
        )
        charts.append(alt.layer(replayed, seen).properties(height=220, width=360))
    if not charts:
        st.info("No replayed size has a value to chart: the table below says what each one counted.")
        return
    show(alt.hconcat(*charts), width="content")
    st.caption(
        "Line: the replay at each size; red diamond: what was observed."
        + (f" Not charted, no replayed value: {' and '.join(undrawn)}." if undrawn else "")
    )
