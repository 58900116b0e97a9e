"""The cache wing's door: what the KV cache did, per replica, per fleet and per session, with no agent step in it. Its
rooms: the hit rate (`hit_rate`), its shortfall split (`shortfall_split`) and the recompute tax (`recompute_tax`, read
from a store by `tax_reads`); the hash chains behind it (`chains`); who stored which block (`ownership`,
`inferred_events`, said in `tie_reports`) and who held it across a fleet (`fleet_index`, `routing`); the tiers
(`hits_by_tier`, `lookups_by_tier`, `tier_health`, `load_rates`) and a connector's own lookups
(`connector_lookups`); prefill cost (`prefill_rates`); pressure against
latency (`pressure`); the ages blocks were evicted at (`ages_at_eviction`) and reused at (`reuse_times`); sessions'
footprints (`footprints`); the requests a replay or an export takes (`replay_requests`); and `kvobs doctor`'s checks
(`agreement`, `prompt_starts`, `token_details`). Outside the wing, code imports this module only
(tests/test_architecture.py); the wing never imports the steps' wing (`kvobs.analytics.steps`), which stands above it.
"""

from kvobs.analytics.cache.ages_at_eviction import ages_words, eviction_ages
from kvobs.analytics.cache.agreement import kv_counter_agreement
from kvobs.analytics.cache.chains import (
    BlockGraph,
    eviction_churn,
    hit_rate_summary,
    hit_rates,
    lookup_times,
    lookup_ts,
    prefix_reuse,
    request_chains,
    with_sessions,
)
from kvobs.analytics.cache.connector_lookups import connector_words, lookups_of
from kvobs.analytics.cache.fleet_index import STORED, FleetIndex
from kvobs.analytics.cache.footprints import footprint_timeline, session_table
from kvobs.analytics.cache.hit_rate import (
    COUNTERS,
    HITS,
    NO_SOURCE,
    QUERIES,
    REQUESTS,
    HitRate,
    hit_rate_in,
    hit_rate_of_sums,
    hit_rate_windows,
    hit_rates_in,
    known_hit_rate,
)
from kvobs.analytics.cache.hits_by_tier import tier_hits
from kvobs.analytics.cache.inferred_events import BY_REQUEST, tied_events
from kvobs.analytics.cache.lookups_by_tier import tier_lookups
from kvobs.analytics.cache.ownership import (
    STORE_SLACK_S,
    block_ties,
    num_inferred,
    owned_stored,
    with_tied_blocks,
)
from kvobs.analytics.cache.prefill_rates import RATE_WINDOW_S, PrefillRates, prefill_overlap
from kvobs.analytics.cache.pressure import QUANTILES, lagged_correlation, pressure_windows, strongest_lag, why_no_lag
from kvobs.analytics.cache.prompt_starts import (
    changing_starts,
    session_changing_start,
    short_start_words,
    short_starts_check,
)
from kvobs.analytics.cache.recompute_tax import (
    PREEMPTION_KINDS,
    TAX_COLUMNS,
    Preemptions,
    preemption_recompute,
    tax_table,
    tax_words,
)
from kvobs.analytics.cache.replay_requests import Replayable, never_scheduled, once_each, replayable
from kvobs.analytics.cache.reuse_times import agent_kinds, range_reuse_times, reuse_times, reuse_words
from kvobs.analytics.cache.routing import (
    FLEET,
    RESIDENCY_LOOKBACK_S,
    ROUTING_KINDS,
    STORED_WITHIN_S,
    SUMMARY_COLUMNS,
    FleetCheck,
    fleet_losses,
    hashes_differ,
    pause_starts,
    request_lookups,
    request_routing,
    routing_losses,
    routing_summary,
    routing_summary_of_sums,
)
from kvobs.analytics.cache.shortfall_split import (
    hit_rate_spread,
    measured_lookups,
    shortfall,
    shortfall_of_sums,
    store_lookups,
)
from kvobs.analytics.cache.tax_reads import range_preemptions, range_tax, shortfall_tax
from kvobs.analytics.cache.tie_reports import session_ties, ties_check, ties_said
from kvobs.analytics.cache.tier_health import tier_checks
from kvobs.analytics.cache.token_details import cached_fill_check, reply_without_details, token_details_check

__all__ = [
    "connector_words",
    "lookups_of",
    "BY_REQUEST",
    "COUNTERS",
    "FLEET",
    "HITS",
    "NO_SOURCE",
    "QUANTILES",
    "QUERIES",
    "RATE_WINDOW_S",
    "REQUESTS",
    "RESIDENCY_LOOKBACK_S",
    "ROUTING_KINDS",
    "STORED",
    "STORED_WITHIN_S",
    "STORE_SLACK_S",
    "SUMMARY_COLUMNS",
    "BlockGraph",
    "FleetCheck",
    "FleetIndex",
    "HitRate",
    "PrefillRates",
    "prefill_overlap",
    "PREEMPTION_KINDS",
    "TAX_COLUMNS",
    "Preemptions",
    "preemption_recompute",
    "tax_table",
    "range_preemptions",
    "range_tax",
    "range_reuse_times",
    "reuse_times",
    "agent_kinds",
    "reuse_words",
    "shortfall_tax",
    "tax_words",
    "Replayable",
    "ages_words",
    "block_ties",
    "cached_fill_check",
    "changing_starts",
    "eviction_ages",
    "eviction_churn",
    "fleet_losses",
    "footprint_timeline",
    "hashes_differ",
    "hit_rate_in",
    "hit_rate_of_sums",
    "hit_rate_spread",
    "hit_rate_summary",
    "hit_rate_windows",
    "hit_rates",
    "hit_rates_in",
    "known_hit_rate",
    "kv_counter_agreement",
    "lagged_correlation",
    "lookup_times",
    "lookup_ts",
    "measured_lookups",
    "never_scheduled",
    "num_inferred",
    "once_each",
    "owned_stored",
    "pause_starts",
    "prefix_reuse",
    "pressure_windows",
    "replayable",
    "reply_without_details",
    "request_chains",
    "request_lookups",
    "request_routing",
    "routing_losses",
    "routing_summary",
    "routing_summary_of_sums",
    "session_changing_start",
    "session_table",
    "session_ties",
    "short_start_words",
    "short_starts_check",
    "shortfall",
    "shortfall_of_sums",
    "store_lookups",
    "strongest_lag",
    "tied_events",
    "tier_checks",
    "tier_hits",
    "tier_lookups",
    "ties_check",
    "ties_said",
    "token_details_check",
    "why_no_lag",
    "with_sessions",
    "with_tied_blocks",
]
