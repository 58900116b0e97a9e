"""What-if: replay the range's requests through other cache sizes and policies, next to what was observed."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views import cache
from kvobs.semconv.reasons import EvictionPolicyName, names

TITLE = "What-if"


@st.cache_data(ttl=60, show_spinner="Replaying...")
def replay(url, since, until, sizes: tuple[int, ...], policy: str, ttl_s: float):
    from instrumented_engine.whatif import ReplayPlan, simulate

    plan = ReplayPlan.from_store(cache.get_store(url), since, until)
    rows = [{"configuration": "observed", "blocks": plan.observed.get("num_blocks"),
             "hit rate": plan.observed.get("hit_rate"), "blocks lost": plan.observed.get("evicted_blocks"),
             "lost in tool pauses": plan.observed.get("lost_in_pause_blocks"),
             "recompute tokens": plan.observed.get("recompute_tokens"), "waited": None}]  # fmt: skip
    for n in sizes:
        r = simulate(plan, num_blocks=n, policy=policy, ttl_s=ttl_s)
        rows.append({"configuration": policy, "blocks": n, "hit rate": r.hit_rate, "blocks lost": r.evicted_blocks,
                     "lost in tool pauses": r.lost_in_pause_blocks, "recompute tokens": r.recompute_tokens,
                     "waited": r.waited})  # fmt: skip
    return pd.DataFrame(rows), len(plan.requests), plan.skipped


def render(ctx) -> None:
    st.header(TITLE)
    with st.form("whatif"):
        c1, c2, c3 = st.columns(3)
        sizes_text = c1.text_input("Cache sizes (blocks)", "32,64,128,256", key="whatif_sizes")
        policy = c2.selectbox("Policy", names(EvictionPolicyName), key="whatif_policy")
        ttl_s = c3.number_input("session_ttl TTL (s)", min_value=0.0, value=30.0, key="whatif_ttl")
        submitted = st.form_submit_button("Replay")
    try:
        sizes = tuple(int(s) for s in sizes_text.split(",") if s.strip())
        if not sizes or min(sizes) < 2:
            raise ValueError
    except ValueError:
        st.error(f"Cache sizes must be whole numbers of at least 2, separated by commas; got {sizes_text!r}.")
        return
    if not submitted and "whatif_ran" not in st.session_state:
        st.info("Choose sizes and a policy, then Replay.")
        return
    st.session_state["whatif_ran"] = True
    try:
        table, replayed, skipped = replay(ctx.url, ctx.since, ctx.until, sizes, policy, float(ttl_s))
    except ValueError as exc:
        st.warning(str(exc))
        return
    st.caption(f"{replayed} requests replayed; {skipped} without a known block chain skipped.")
    st.dataframe(table, hide_index=True, column_config={"hit rate": st.column_config.NumberColumn(format="percent")})
    st.caption(
        "blocks lost: each lost block once (evictions, invalidations, vLLM removals; resets not included), "
        "as on the Overview. lost in tool pauses: blocks a session lost while it waited on a tool, counted "
        "once it came back; the replay knows each session's last request, so nothing is pending there."
    )
