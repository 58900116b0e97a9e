"""Analytics over the store: pure functions of the DataFrames its reads and lookups return (`kvobs.store.interface`).

- `pressure`: cache pressure against latency per window, lagged correlation.
- `attribution`: why each agent step failed or got slow, with evidence.
- `chains`: request hash chains, achieved vs available hit rate, recompute cost, prefix reuse, eviction churn.
- `footprints`: per-session KV footprint timelines and the session table.
"""
