"""Router what-if: a fleet's recorded traffic replayed through one block manager per replica, each at its
observed size, under routing policies, to say what another router would have hit, recomputed and balanced.

    plan = FleetPlan.from_store(store)                        # requests, chains, each replica's size and recording
    results = [simulate_fleet(plan, policy) for policy in POLICIES]

Every policy goes through the same replay (`whatif.whole_length.WholeLengthCache`: a request takes its prompt's blocks
at its lookup and its decode's as its output fills them, to its recorded finish, and waits FCFS when its replica has no
room), so their rows compare like with like; `as_routed` sends each request where it went. The policies:

- `as_routed`: the replica that served it (the replay of the recorded routing, checked against the observed hit
  rate by `whatif.fidelity.fleet_fidelity`).
- `round_robin`: the next replica, request by request.
- `session_affinity`: the replica its session's first request got (round robin over sessions); sticky after.
- `prefix`: llm-d's precise prefix-cache scorer: each replica scored by the longest consecutive run of the request's
  block hashes from the first that it holds (weighted by tier: GPU 1.0, CPU 0.8, llm-d's defaults; a replay has one
  tier, so 1.0), the highest wins, ties going to the least loaded (fewest requests in flight), as llm-d pairs the
  scorer with its load-aware ones (llm-d's "Precise Prefix Cache Routing" guide and kv-cache architecture).
- `prefix_load`: Dynamo's KV router: the replica with the least cost = `prefill_load_scale` x the prefill blocks
  the request still needs there (its blocks beyond its overlap) + the replica's active decode blocks (blocks held by
  its requests in flight); with `temperature` > 0 a replica is drawn by softmax over the negated costs, normalised,
  as `--router-temperature` does (Dynamo's router docs, "Routing Concepts: Cost Calculation").

Reported per policy (`FleetResult`): the hit rate, the prompt tokens recomputed (blocks this replay had computed
before), the routing loss (at each lookup, the blocks another replica held beyond what the chosen one had), blocks
lost in tool pauses, the load imbalance (max / mean requests and prompt tokens per replica) and the queueing it
caused (requests that waited for room, and the seconds they waited).
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field

import pandas as pd

from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.observers.losses import LossTally
from instrumented_engine.whatif.engine_rules import registers_of
from instrumented_engine.whatif.replay import ReplayPlan
from instrumented_engine.whatif.units import ReplayClock, WhatIfResult, replay_sequence
from instrumented_engine.whatif.whole_length import WholeLengthCache
from kvobs.semconv.reasons import RouterPolicy
from kvobs.store.interface import Store

POLICIES = tuple(p.value for p in RouterPolicy)
GPU_WEIGHT, CPU_WEIGHT = 1.0, 0.8  # llm-d's precise prefix-cache scorer: a block in the GPU cache, in its CPU tier


@dataclass
class FleetPlan:
    plan: ReplayPlan  # every replica's requests, with their chains
    instance_of: dict[str, str]  # request id -> the replica that served it
    sizes: dict[str, int]  # replica -> its cache in blocks
    tiers: dict[str, int] = field(default_factory=dict)  # replica -> its offload tier in blocks (missing: none)
    engines: dict[str, str] = field(default_factory=dict)  # replica -> its latest run's engine (missing: not said)

    @classmethod
    def from_store(
        cls, store: Store, since=None, until=None, *, num_blocks: int | None = None, tier_blocks: int | None = None
    ) -> FleetPlan:
        """The fleet's requests of [since, until], each replica at its observed size (its latest snapshot's
        `blocks_total`, as the what-if's observed row), else `num_blocks`; with the offload tier its latest run
        recorded (`runs.offload_blocks`), or `tier_blocks` below every replica's cache.

        Raises:
            ValueError: fewer than two replicas, or a replica whose size is unknown and no `num_blocks`.
        """
        requests = store.reads.requests(since, until)
        instance_of = dict(zip(requests["request_id"], requests["instance"]))
        names = sorted(set(instance_of.values()))
        if len(names) < 2:
            raise ValueError(f"a fleet what-if needs requests of two replicas or more; this range has {names}")
        snaps = store.reads.instance_snapshots(since, until).dropna(subset=["blocks_total"])
        # + 1: the block manager keeps one block aside, as the engine does (`whatif.observed_figures` likewise)
        observed = {name: int(group["blocks_total"].iloc[-1]) + 1 for name, group in snaps.groupby("instance")}
        sizes = {}
        for name in names:
            size = observed.get(name, num_blocks)
            if size is None:
                raise ValueError(f"{name}'s cache size is unknown (no snapshot says it): give --num-blocks")
            sizes[name] = size
        runs = store.reads.runs(instances=names).sort_values("started_at")
        runs = runs if until is None else runs[runs["started_at"] <= until]  # the runs of the range, latest last
        recorded = {r.instance: int(r.offload_blocks) for r in runs.itertuples() if pd.notna(r.offload_blocks)}
        tiers = dict.fromkeys(names, tier_blocks) if tier_blocks is not None else recorded
        engines = {r.instance: r.engine for r in runs.itertuples() if isinstance(r.engine, str)}
        return cls(ReplayPlan.from_store(store, since, until), instance_of, sizes, tiers, engines)


@dataclass
class FleetResult:
    policy: str
    requests: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    tier_hit_tokens: int = 0  # ... of them loaded from a replica's offload tier
    recompute_tokens: int = 0
    routed_tokens: int = 0  # at each lookup: tokens another replica held beyond what the chosen one had
    lost_in_pause_blocks: int = 0
    evicted_blocks: int = 0
    waited: int = 0
    wait_s: float = 0.0
    per_replica: dict[str, WhatIfResult] = field(default_factory=dict)

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None

    def imbalance(self, measure: str) -> float | None:
        """max / mean over the replicas of `requests` or `query_tokens`: 1.0 is perfectly even."""
        values = [getattr(r, measure) for r in self.per_replica.values()]
        mean = sum(values) / len(values) if values else 0
        return max(values) / mean if mean else None


class _Router:
    def __init__(self, policy: str, names: list[str], fleet: FleetPlan, scale: float, temperature: float, seed: int):
        self.policy, self.names, self.fleet = policy, names, fleet
        self.scale, self.temperature, self.rng = scale, temperature, random.Random(seed)
        self.turn = itertools.count()
        self.sessions: dict[str, str] = {}

    def choose(self, req, seq, caches: dict[str, WholeLengthCache], prefixes: dict[str, tuple[int, int]]) -> str:
        """The replica for `req`; `prefixes`: per replica, the blocks of its prefix in the cache and then in the
        offload tier."""
        policy = self.policy
        if policy == RouterPolicy.AS_ROUTED.value:
            return self.fleet.instance_of[req.request_id]
        if policy == RouterPolicy.ROUND_ROBIN.value:
            return self.names[next(self.turn) % len(self.names)]
        if policy == RouterPolicy.SESSION_AFFINITY.value:
            if req.session_id is None:
                return self.names[next(self.turn) % len(self.names)]
            if req.session_id not in self.sessions:
                self.sessions[req.session_id] = self.names[next(self.turn) % len(self.names)]
            return self.sessions[req.session_id]
        in_flight = {name: len(cache.totals) + len(cache.waiting) for name, cache in caches.items()}
        if policy == RouterPolicy.PREFIX.value:  # llm-d: a block in a lower tier scores less
            score = {n: GPU_WEIGHT * gpu + CPU_WEIGHT * cpu for n, (gpu, cpu) in prefixes.items()}
            return max(self.names, key=lambda n: (score[n], -in_flight[n], -self.names.index(n)))
        blocks = len(seq.block_hashes[: (req.prompt_tokens - 1) // caches[self.names[0]].block_size])
        # Dynamo's KV router: one overlap over the tiers it indexes (a block in any tier need not be computed)
        cost = {n: self.scale * (blocks - sum(prefixes[n])) + caches[n].active_blocks for n in self.names}
        if self.temperature <= 0:
            return min(self.names, key=lambda n: (cost[n], self.names.index(n)))
        spread = (max(cost.values()) - min(cost.values())) or 1.0
        weights = [math.exp(-(cost[n] - min(cost.values())) / spread / self.temperature) for n in self.names]
        return self.rng.choices(self.names, weights=weights)[0]


def simulate_fleet(
    fleet: FleetPlan, policy: str, *, prefill_load_scale: float = 1.0, temperature: float = 0.0, seed: int = 0
) -> FleetResult:
    """`fleet`'s requests in arrival order, each sent to the replica `policy` picks at its lookup."""
    plan, names = fleet.plan, sorted(fleet.sizes)
    clock, out = ReplayClock(), FleetResult(policy)
    caches, tallies = {}, {}
    for name in names:
        manager = BlockManager(
            fleet.sizes[name], plan.block_size, clock=clock, offload_blocks=fleet.tiers.get(name) or 0
        )
        result = WhatIfResult(fleet.sizes[name], policy)
        registers = registers_of(fleet.engines.get(name))
        caches[name] = WholeLengthCache(manager, plan.block_size, result, clock, registers=registers)
        tallies[name] = LossTally(tier=manager.tier is not None)
    arrivals = sorted(plan.requests, key=lambda r: r.arrival_ts)
    last: dict[str | None, str] = {r.session_id: r.request_id for r in arrivals if r.session_id is not None}
    for cache in caches.values():
        cache.last_request = last
    router = _Router(policy, names, fleet, prefill_load_scale, temperature, seed)
    key = caches[names[0]].key

    released = sorted((ts, sid) for sid, ts in fleet.plan.releases.items())
    last_replica: dict[str, str] = {}  # session -> the replica its latest request went to

    def finish_until(ts: float) -> None:
        """Finishes and session releases up to `ts`, in time order; a release drops the session's blocks on the
        replica its last request went to, as the agent released it where its last step ran."""
        while True:
            name = min(names, key=lambda n: caches[n].next_finish())
            finish = caches[name].next_finish()
            release = released[0][0] if released else float("inf")
            if min(finish, release) > ts or min(finish, release) == float("inf"):
                return
            if finish <= release:
                caches[name].finish_one()
                caches[name].tally(tallies[name])
                continue
            clock.now, session = released.pop(0)
            where = last_replica.get(session)
            if where is not None:
                caches[where].manager.release_session(session)
                caches[where].tally(tallies[where])

    for req in arrivals:
        finish_until(req.arrival_ts)
        clock.now = req.arrival_ts
        seq = replay_sequence(req, key, plan.block_size)
        cap = (req.prompt_tokens - 1) // plan.block_size
        prefixes = {}
        for n in names:
            gpu = len(caches[n].manager.lookup(seq)[:cap])
            prefixes[n] = (gpu, caches[n].manager.tier_held(seq, gpu))
        name = router.choose(req, seq, caches, prefixes)
        if req.session_id is not None:
            last_replica[req.session_id] = name
        held = {n: sum(blocks) for n, blocks in prefixes.items()}  # a block in any tier: loaded, not recomputed
        out.routed_tokens += plan.block_size * max(max(held.values()) - held[name], 0)
        caches[name].arrive(req, seq)  # the sequence its lookups were made with
        caches[name].tally(tallies[name])
    finish_until(float("inf"))
    for name in names:
        result, losses = caches[name].result, tallies[name]
        result.evicted_blocks, result.saved_in_pause_blocks = losses.num_lost, losses.num_saved_in_pause
        result.lost_in_pause_blocks = losses.num_lost_in_pause - losses.num_saved_in_pause  # not given back
        out.per_replica[name] = result
        out.requests += result.requests
        out.query_tokens += result.query_tokens
        out.hit_tokens += result.hit_tokens
        out.tier_hit_tokens += result.tier_hit_tokens
        out.recompute_tokens += result.recompute_tokens
        out.lost_in_pause_blocks += result.lost_in_pause_blocks
        out.evicted_blocks += result.evicted_blocks
        out.waited += result.waited
        out.wait_s += caches[name].wait_s
    return out


# the router what-if's table, in the terminal and on the What-if page (`fleet_rows`)
FLEET_COLUMNS = (
    "router",
    "hit rate",
    "recomputed tokens",
    "routing loss (tokens)",
    "lost in tool pauses",
    "requests max/mean",
    "tokens max/mean",
    "waited",
    "wait (s)",
    "loaded from tier (tokens)",
)


def fleet_rows(results: list[FleetResult]) -> list[dict]:
    """One row per router (columns `FLEET_COLUMNS`; None where unknown)."""
    return [
        dict(
            zip(
                FLEET_COLUMNS,
                (
                    r.policy,
                    r.hit_rate,
                    r.recompute_tokens,
                    r.routed_tokens,
                    r.lost_in_pause_blocks,
                    r.imbalance("requests"),
                    r.imbalance("query_tokens"),
                    r.waited,
                    r.wait_s,
                    r.tier_hit_tokens,
                ),
            )
        )
        for r in results
    ]
