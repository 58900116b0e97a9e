"""Analytics over the store: pure functions of the DataFrames its reads and lookups return (`kvobs.store.interface`).

Two wings, each reached through its door, and a ground both stand on:
- `kvobs.analytics.cache`: what the KV cache did (hit rate and its shortfall, chains, ownership, routing, tiers,
  pressure, footprints), with no agent step in it;
- `kvobs.analytics.steps`, above it: why each agent step failed or got slow, decided once and read after;
- the ground: engine runs (`runs`), the least sample a figure needs (`samples`), a range summed per window
  (`windows`).
"""
