"""`kvobs whatif`: replay the recorded requests through other cache sizes and policies, or a fleet's through other
routers.

kvobs whatif --store sqlite:///kvobs.db --num-blocks 32,64,128 --policy session_ttl --ttl 30
kvobs whatif --store sqlite:///kvobs.db --num-blocks 64 --policy session_ttl --ttl 0,60,300,3600  # a sweep, its knee
kvobs whatif --store sqlite:///kvobs.db --replicas                 # every router policy, each replica at its size
kvobs whatif --trace trace.jsonl --block-size 16 --num-blocks 64,128  # a Mooncake trace (kvobs export's, or any)
"""

from __future__ import annotations

import argparse
import sys

from kvobs.commands.common import add_store_flag, check_memory, number, start_or_report
from kvobs.semconv.reasons import EvictionPolicyName, RouterPolicy, names

# What one block of the replay's block manager takes in memory (measured on `BlockManager(1_000_000, 16)`): a size
# whose blocks would not fit is refused, not run until the machine swaps.
REPLAY_BLOCK_BYTES = 400


def _listed(text: str, parse, what: str, example: str) -> list:
    """A comma-separated flag's values (none for an empty one), or the flag's error naming what it takes."""
    try:
        return [parse(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of {what}: {text!r} (example: {example})") from None


def block_counts(text: str) -> list[int]:
    sizes = _listed(text, int, "block counts", "32,64,128")
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError(f"block counts must be at least 2: {text!r}")
    return sizes


def _ttls(text: str) -> list[float]:
    ttls = _listed(text, float, "seconds", "0,60,300,3600")
    if not ttls:
        raise argparse.ArgumentTypeError(f"not a list of seconds: {text!r} (example: 0,60,300,3600)")
    if min(ttls) < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return sorted(set(ttls))


def add_gpu_hour_cost_flag(p: argparse.ArgumentParser) -> None:
    """`--gpu-hour-cost PRICE`: the prefill time each size saves, priced (whatif and report alike)."""
    p.add_argument(
        "--gpu-hour-cost",
        type=number(float, at_least=0),
        metavar="PRICE",
        help="what one GPU-hour costs: the prefill time each size saves, priced (in the unit given)",
    )


def add_parser(sub) -> None:
    p = sub.add_parser("whatif", help="replay recorded traffic through other KV cache sizes and eviction policies")
    add_store_flag(p)
    p.add_argument("--num-blocks", type=block_counts, metavar="N[,N...]", help="cache sizes in blocks")
    p.add_argument(
        "--tier-blocks",
        type=block_counts,
        metavar="N[,N...]",
        help="CPU tier or more cache: each run at its observed size with N blocks added to an offload tier below "
        "its cache, and N added to the cache; with --replicas, one N: an offload tier of N below every replica",
    )
    p.add_argument(
        "--replicas",
        action="store_true",
        help="replay the fleet's traffic under each router policy (each replica at its observed size)",
    )
    p.add_argument(
        "--router",
        action="append",
        choices=names(RouterPolicy),
        help="with --replicas: a policy to replay (repeat it; default: all)",
    )
    p.add_argument(
        "--prefill-load-scale",
        type=number(float, at_least=0),
        default=1.0,
        help="prefix_load (Dynamo's KV router): weight of the prefill blocks against the active decode blocks",
    )
    p.add_argument(
        "--router-temperature",
        type=number(float, at_least=0),
        default=0.0,
        help="prefix_load: 0 picks the least cost; above 0 draws by softmax over the costs",
    )
    p.add_argument(
        "--policy",
        default=EvictionPolicyName.LRU.value,
        choices=names(EvictionPolicyName),
        help="eviction policy to replay",
    )
    p.add_argument(
        "--ttl",
        type=_ttls,
        default=[30.0],
        metavar="S[,S...]",
        help="session_ttl: seconds a paused session is protected; several: a sweep at each size, with its knee",
    )
    p.add_argument(
        "--reuse-by",
        choices=("agent", "tool", "session"),  # (`whatif.session_kinds.KINDS`: the parser imports no engine)
        default="agent",
        help="with a --ttl sweep: group the eviction ages and reuse times by the session's agent, the tool of the "
        "pause (before each step, or the evicted block's), or each session",
    )
    p.add_argument("--since", type=float, metavar="EPOCH_S", help="replay requests from this time")
    p.add_argument("--until", type=float, metavar="EPOCH_S", help="... up to this time")
    p.add_argument(
        "--block-size",
        type=number(int, at_least=1),
        help="tokens per block (default: what the recorded events say); with --trace, the tokens one hash id stands "
        "for (kvobs export prints it; Mooncake's published traces use 512)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a Mooncake trace (JSONL: Mooncake's, AIPerf's or Dynamo's agentic rows) instead of the store",
    )
    p.add_argument(
        "--prefill-tokens-per-s",
        type=number(float, above=0),
        help="with --trace: how fast a prompt is prefilled, for rows that do not say when they finished",
    )
    p.add_argument(
        "--decode-tokens-per-s",
        type=number(float, above=0),
        help="with --trace: how fast a reply is decoded, for rows that do not say when they finished",
    )
    add_gpu_hour_cost_flag(p)
    p.add_argument(
        "--gpus-per-engine",
        type=number(int, at_least=1),
        default=1,
        help="GPUs one engine instance runs on (tensor parallel): its prefill seconds x this are GPU-seconds",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from instrumented_engine.whatif.fidelity import fidelity
    from instrumented_engine.whatif.runs import observed_total, replay_plans, simulate_runs
    from instrumented_engine.whatif.session_kinds import ages_and_reuse
    from instrumented_engine.whatif.tier_sweep import tier_sweep
    from instrumented_engine.whatif.victim_choice import tax_lines
    from kvobs.analytics.cache import ages_words, reuse_words
    from kvobs.store import open_store

    if not args.trace and (args.prefill_tokens_per_s is not None or args.decode_tokens_per_s is not None):
        print(
            "kvobs whatif: --prefill-tokens-per-s and --decode-tokens-per-s time a trace's rows: give them with "
            "--trace (a store's requests carry their own times)",
            file=sys.stderr,
        )
        return 2
    if args.trace and not args.num_blocks:
        print("kvobs whatif: --trace needs --num-blocks N[,N...]: the cache sizes to replay through", file=sys.stderr)
        return 2
    if not args.replicas and not args.num_blocks and not args.tier_blocks:
        print(
            "kvobs whatif: give --num-blocks N[,N...] (cache sizes), --tier-blocks N[,N...] (an offload tier) or "
            "--replicas (routers)",
            file=sys.stderr,
        )
        return 2
    if args.reuse_by != "agent" and len(args.ttl) < 2:
        print(
            "kvobs whatif: --reuse-by groups the ages and reuse times of a --ttl sweep: give several --ttl",
            file=sys.stderr,
        )
        return 2
    if len(args.ttl) > 1 and args.policy != EvictionPolicyName.SESSION_TTL.value:
        print("kvobs whatif: several --ttl values sweep session_ttl: give --policy session_ttl", file=sys.stderr)
        return 2
    if args.replicas and args.tier_blocks and len(args.tier_blocks) > 1:
        print("kvobs whatif: with --replicas, --tier-blocks takes one size (every replica's tier)", file=sys.stderr)
        return 2
    if args.num_blocks:  # a size the replay cannot hold is refused before the store is read
        largest = max(args.num_blocks)
        replica = " (for each replica)" if args.replicas else ""
        what = f"the replay's block manager{replica}, about {REPLAY_BLOCK_BYTES} bytes a block"
        try:
            check_memory("--num-blocks", largest, largest * REPLAY_BLOCK_BYTES, what)
        except ValueError as exc:
            print(f"kvobs whatif: {exc}", file=sys.stderr)
            return 2
    if args.trace:
        return _trace(args)
    store = start_or_report("whatif", lambda: open_store(args.store, must_exist=True))
    if store is None:
        return 2
    if args.replicas:
        return _fleet(args, store)
    try:
        plans = start_or_report(
            "whatif", lambda: replay_plans(store, args.since, args.until, block_size=args.block_size)
        )
        if plans is None:
            return 2
        if not any(plan.requests for plan in plans):
            print("kvobs whatif: no recorded request has a known block chain to replay", file=sys.stderr)
            return 2
        sizes = args.num_blocks or []
        runs = [simulate_runs(plans, num_blocks=n, policy=args.policy, ttl_s=t) for n in sizes for t in args.ttl]
        observed = observed_total(plans, store, args.since, args.until)
        checks = fidelity(plans, observed["hit"])
        saved = _time_saved(store, plans, [total for total, _ in runs], checks[1], args)
        tax = tax_lines(store, plans, checks[1], args.since, args.until, ttl_s=args.ttl[0])
        sweep = tier_sweep(plans, store, tuple(args.tier_blocks)) if args.tier_blocks else None
        ages = ages_and_reuse(store, args.since, args.until, args.reuse_by) if len(args.ttl) > 1 else None
    except ValueError as exc:
        print(f"kvobs whatif: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(format_table(plans, observed, runs, checks))
    print("\n" + saved)
    print("\n" + "\n".join(tax))
    if ages is not None:
        print("\n" + format_knees([total for total, _ in runs]))
        print("\n" + ages_words(ages[0]))
        print("\n" + reuse_words(ages[1]))
    if sweep is not None:
        print("\n" + format_sweep(*sweep))
    return 0


def _time_saved(store, plans, results, checks, args: argparse.Namespace) -> str:
    """Each size's hits as prefill time saved against the replay at the observed point (`whatif.time_saved`)."""
    from instrumented_engine.whatif.time_saved import saved_table, sizes_saved

    options = {"gpus": args.gpus_per_engine, "gpu_hour_cost": args.gpu_hour_cost}
    return saved_table(*sizes_saved(store, plans, checks, results, args.since, args.until, **options))


def _trace(args: argparse.Namespace) -> int:
    """A Mooncake trace through the replay at each size: one run from an empty cache, no observed row."""
    from instrumented_engine.whatif.replay import simulate
    from instrumented_engine.whatif.trace_plan import trace_plan
    from kvobs.formats.mooncake_trace import ServiceRates, read_trace

    refused = _trace_refusal(args)
    if refused:
        print(f"kvobs whatif: {refused}", file=sys.stderr)
        return 2
    rates = (
        None if args.prefill_tokens_per_s is None else ServiceRates(args.prefill_tokens_per_s, args.decode_tokens_per_s)
    )
    try:
        with open(args.trace, encoding="utf-8") as lines:
            trace = read_trace(lines, rates)
    except (OSError, ValueError) as exc:  # (TraceError is a ValueError)
        print(f"kvobs whatif: {args.trace}: {exc}", file=sys.stderr)
        return 2
    if not trace.requests:
        print(f"kvobs whatif: {args.trace} has no rows", file=sys.stderr)
        return 2
    plan = trace_plan(trace, args.block_size)
    runs = [simulate(plan, num_blocks=n, policy=args.policy, ttl_s=t) for n in args.num_blocks for t in args.ttl]
    print(format_trace_table(args.trace, trace, plan.block_size, runs))
    if len(args.ttl) > 1:
        print("\n" + format_knees(runs))
    return 0


def _trace_refusal(args: argparse.Namespace) -> str | None:
    """Why the flags given with --trace cannot run, or None."""
    if args.replicas or args.tier_blocks:
        return "--replicas and --tier-blocks replay a store's runs, not a trace: give --num-blocks with --trace"
    if args.block_size is None:
        return (
            "--trace needs --block-size: the tokens one hash id stands for (kvobs export prints it; Mooncake's "
            "published traces use 512)"
        )
    if (args.prefill_tokens_per_s is None) != (args.decode_tokens_per_s is None):
        return "give both --prefill-tokens-per-s and --decode-tokens-per-s, or neither"
    return None


def format_trace_table(path: str, trace, block_size: int, runs: list) -> str:
    """A trace's what-if table: each size through the same replay, from an empty cache; what its times came from."""
    from instrumented_engine.whatif.replay import REPLAY_WORDS

    timed = [f"{trace.recorded:,} timed as kvobs recorded them"] if trace.recorded else []
    if trace.modeled:
        rates = trace.rates
        timed.append(
            f"{trace.modeled:,} modeled: each prompt prefilled at {rates.prefill_tokens_per_s:,.0f} tokens/s and its "
            f"reply decoded at {rates.decode_tokens_per_s:,.0f} tokens/s, whatever the cache held"
        )
    lines = [
        f"{len(trace.requests):,} requests replayed from {path}, one hash id a block of {block_size} tokens "
        f"({'; '.join(timed)})",
        "",
        *_rows(None, runs),
        "",
        "A trace is one replay from an empty cache, of its rows as they say: nothing was observed to compare with. "
        f"As a recorded vLLM run is replayed, {REPLAY_WORDS} (vLLM's: from its lookup on).",
    ]
    return "\n".join(lines)


def format_knees(results: list) -> str:
    """Where the TTL sweep's hit rate stops paying, a line per cache size (`whatif.ttl_knee`)."""
    from instrumented_engine.whatif.ttl_knee import knee_words

    sizes: dict[int, list] = {}
    for r in results:
        sizes.setdefault(r.num_blocks, []).append((r.ttl_s, r.hit_rate))
    return "\n".join(["Hit rate against the TTL:", *(f"- {knee_words(n, points)}" for n, points in sizes.items())])


def _fleet(args: argparse.Namespace, store) -> int:
    from instrumented_engine.whatif.fleet import POLICIES, FleetPlan, simulate_fleet

    try:
        size = args.num_blocks[0] if args.num_blocks else None
        tier = args.tier_blocks[0] if args.tier_blocks else None
        fleet = start_or_report(
            "whatif", lambda: FleetPlan.from_store(store, args.since, args.until, num_blocks=size, tier_blocks=tier)
        )
        if fleet is None:
            return 2
        options = {"prefill_load_scale": args.prefill_load_scale, "temperature": args.router_temperature}
        results = [simulate_fleet(fleet, policy, **options) for policy in args.router or POLICIES]
    finally:
        store.close()
    print(format_fleet(fleet, results))
    return 0


def format_fleet(fleet, results) -> str:
    """The fleet what-if's table: one row per router policy, all through the same replay; the observed hit rate
    and, when `as_routed` was replayed, its error against it."""
    from instrumented_engine.whatif.fidelity import fleet_fidelity, observed_words
    from instrumented_engine.whatif.fleet import FLEET_COLUMNS, fleet_rows
    from instrumented_engine.whatif.replay import INFERRED
    from kvobs.semconv.reasons import RouterPolicy

    sizes = ", ".join(f"{name} {n:,}" for name, n in sorted(fleet.sizes.items()))
    lines = [
        f"{len(fleet.plan.requests)} requests replayed ({fleet.plan.skipped} without a known chain skipped) over "
        f"{len(fleet.sizes)} replicas (blocks: {sizes}), block size {fleet.plan.block_size}",
        *([INFERRED.format(fleet.plan.inferred)] if fleet.plan.inferred else []),
        "",
        "| " + " | ".join(FLEET_COLUMNS) + " |",
        "|" + "---|" * len(FLEET_COLUMNS),
    ]
    for row in fleet_rows(results):
        values = list(row.values())
        cells = [
            values[0],
            _pct(values[1]),
            *map(_num, values[2:5]),
            *("-" if v is None else f"{v:.2f}" for v in values[5:7]),
            _num(values[7]),
            f"{values[8]:.1f}",
            _num(values[9]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Every router through the same replay (each request holds its whole length from its lookup to its recorded "
        "finish, and waits for room on a full replica), so the rows compare like with like; `as_routed` sends each "
        "request where it went. routing loss: at each lookup, the tokens another replica held beyond what the "
        "chosen one had. max/mean: 1.00 is an even load. prefix: llm-d's precise prefix-cache scorer (longest "
        "resident prefix, ties by load); prefix_load: Dynamo's KV router (least prefill-load scale x blocks to "
        "compute + active decode blocks).",
    ]
    hit = fleet.plan.observed.get("hit")
    said = "" if hit is None else observed_words(hit.source)
    lines += [
        "",
        f"observed: hit rate {_pct(None if hit is None else hit.rate)} (the fleet's{', ' + said if said else ''})",
    ]
    routed = [r for r in results if r.policy == RouterPolicy.AS_ROUTED.value]
    if routed:
        lines.append(fleet_fidelity(fleet, routed[0]).describe())
    return "\n".join(lines)


def format_sweep(rows: list[dict], left_out: list) -> str:
    """The tier sweep's table (`whatif.tier_sweep`): the observed setup, then each number of blocks added to an
    offload tier or to the cache; the runs left out, and why."""
    from instrumented_engine.whatif.tier_sweep import SWEEP_COLUMNS, SWEEP_LEGEND, describe_left_out
    from kvobs.times import local_time

    lines = ["| " + " | ".join(SWEEP_COLUMNS) + " |", "|" + "---|" * len(SWEEP_COLUMNS)]
    for row in rows:
        values = list(row.values())
        seconds = "not measured" if values[5] is None else f"{values[5]:.2f}"
        cells = [values[0], _num(values[1]), _pct(values[2]), *map(_num, values[3:5]), seconds, *map(_num, values[6:])]
        lines.append("| " + " | ".join(cells) + " |")
    if left_out:
        lines += ["", "left out: " + describe_left_out(left_out, local_time)]
    return "\n".join([*lines, "", SWEEP_LEGEND])


LEGEND = (
    "blocks lost: each lost block once (evictions, invalidations, vLLM removals; resets not included). "
    "lost in tool pauses: blocks a session lost while it waited on a tool, counted once it came back "
    "(observed: {pending} more idle losses still pending; the replay knows each session's last request, so "
    "nothing is pending there). Our engine's data with its allocations is replayed step for step: at the observed "
    "size and policy the replay is the run. Data without them (vLLM's, or a kvobs serve seen through a collector) is "
    "replayed approximately: {replay_words}."
)


def _pct(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value) -> str:
    return "-" if value is None else f"{value:,}"


def format_table(plans, observed: dict, runs: list, checks=None) -> str:
    """The replay's table: observed, then each size (every run replayed through its own cache, added up); with
    several runs, each run's own rows after; `checks` (`whatif.fidelity.fidelity`'s): the replay's error at the
    observed point, after the table it qualifies."""
    from instrumented_engine.whatif.fidelity import PAUSES_NOT_COMPARABLE
    from instrumented_engine.whatif.replay import DUPLICATES, INFERRED, NEVER_ADMITTED, REPLAY_WORDS
    from kvobs.times import local_time

    replayed, skipped = sum(len(p.requests) for p in plans), sum(p.skipped for p in plans)
    duplicates = sum(p.duplicates for p in plans)
    lines = [
        f"{replayed} requests replayed ({skipped} without a known chain skipped), block size "
        f"{', '.join(sorted({str(p.block_size) for p in plans}))}"
    ]
    if duplicates:
        lines.append(DUPLICATES.format(duplicates))
    never = sum(p.never_admitted for p in plans)
    if never:
        lines.append(NEVER_ADMITTED.format(never))
    inferred = sum(p.inferred for p in plans)
    if inferred:
        lines.append(INFERRED.format(inferred))
    if len(plans) > 1:
        lines.append(
            f"{len(plans)} runs, replayed one by one (each began with an empty cache): "
            + "; ".join(p.span.label(local_time) for p in plans)
        )
    elif plans[0].span is not None and plans[0].span.run_id is None:
        lines.append("no engine runs are recorded in this store: the range is replayed as one run")
    lines += ["", *_rows(observed, [total for total, _ in runs])]
    if checks is not None:
        lines += ["", checks[0].describe()]
        if not checks[0].pauses_comparable:
            lines.append(PAUSES_NOT_COMPARABLE)
    if len(plans) > 1:
        for i, plan in enumerate(plans):
            lines += ["", f"{plan.span.label(local_time)}:", *_rows(plan.observed, [per[i] for _, per in runs])]
            if checks is not None:
                lines.append(checks[1][i].describe())
    pending = _num(observed.get("pending_idle_blocks"))
    lines += ["", LEGEND.format(pending=pending, replay_words=REPLAY_WORDS)]
    too_large = [(total.num_blocks, total.too_large) for total, _ in runs if total.too_large]
    if too_large:
        lines.append("")
        lines.append(
            "requests longer than the whole cache were not admitted: "
            + ", ".join(f"{n} blocks: {count}" for n, count in too_large)
        )
    return "\n".join(lines)


def _rows(obs: dict | None, results) -> list[str]:
    """The table's lines: the observed row first (none when `obs` is None: a trace has nothing observed), then each
    replay's."""
    from instrumented_engine.whatif.runs import COMPARISON, comparison

    lines = ["| " + " | ".join(COMPARISON) + " |", "|" + "---|" * len(COMPARISON)]
    for row in comparison(obs, results):
        cells = [row["configuration"], _num(row["blocks"]), _pct(row["hit rate"]), *map(_num, list(row.values())[3:])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
