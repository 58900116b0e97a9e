"""What a prefix hit is worth on the engine: time to first token by where the prompt's prefix was found, against the
prefix's length. For each `--lengths` L (tokens, whole blocks) and round:

- miss: a prompt of L tokens and a short suffix, nothing of it cached: every token computed (the baseline);
- device hit: the same L tokens with another suffix, found in the device cache: only the suffix computed;
- offload-tier hit: a second prompt of L tokens fills the device cache, evicting the first; the first L tokens again
  with a third suffix are then found in the offload tier below the cache (vLLM's native offloading, written through
  as blocks are computed) and loaded, not computed.

Each request asks for one token, so its TTFT (the engine's own, arrival to first token) is its queueing (none: one
request at a time), its lookup, its loads and its prefill. Every request's lookup is checked against what its case
claims (the engine's `PrefixLookup` events: tokens hit in the device cache, tokens loaded from the tier); a case
whose lookup differs stops the run. The device cache holds one prompt and its suffix (so the second prompt evicts the
first), the tier four. Prompts are random token ids, new each round, on SmolLM2 at the engine's default dtype; a
first round at each length warms the engine up, untimed.

    python bench/ttft_by_source.py [--lengths 1024,2048,4096,8064] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics

from results import Result, record  # bench/ is on sys.path when a script in it runs
from tqdm.auto import tqdm

from instrumented_engine import LLM, SamplingParams
from instrumented_engine.engine.events import PrefixLookup
from instrumented_engine.models.loader import open_model

BLOCK_SIZE = 16
SUFFIX = 8  # tokens after the prefix: less than a block, so the prefix's blocks are whole and the suffix is computed
MISS, DEVICE, TIER = "miss", "device-cache hit", "offload-tier hit"
CASES = (MISS, DEVICE, TIER)
TOKENS = (1000, 40000)  # token ids drawn from this range (ordinary vocabulary, no special tokens)


def measure(llm: LLM, prompt: list[int], case: str, length: int) -> float:
    """The request's TTFT in seconds, once its lookup is checked against `case`."""
    seen = len(llm.events)
    (out,) = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    (lookup,) = [e for e in llm.events[seen:] if isinstance(e, PrefixLookup) and not e.readmission]
    found = (lookup.hit_tokens, lookup.tier_hit_tokens)
    wanted = {MISS: (0, 0), DEVICE: (length, 0), TIER: (0, length)}[case]
    if found != wanted:
        raise RuntimeError(
            f"{case} at {length:,} tokens: the lookup found {found[0]:,} tokens in the device cache and {found[1]:,} "
            f"in the offload tier, not {wanted[0]:,} and {wanted[1]:,}"
        )
    return out.first_token_ts - out.arrival_ts


def rounds(source, length: int, repeats: int, rng: random.Random) -> dict[str, list[float]]:
    """Each case's TTFTs at one prefix length, on an engine sized for it."""
    per_seq = length + SUFFIX + 1  # (and the token asked for)
    blocks = -(-per_seq // BLOCK_SIZE) + 1  # (and the null block)
    most = source.config.kv_bytes_per_token(4) * BLOCK_SIZE  # a block's bytes at float32, the widest dtype
    llm = LLM(
        source=source,
        progress=False,
        num_blocks=blocks,
        block_size=BLOCK_SIZE,
        max_model_len=per_seq,
        kv_offloading_size=4 * blocks * most,
    )

    def tokens(n: int) -> list[int]:
        return [rng.randrange(*TOKENS) for _ in range(n)]

    times: dict[str, list[float]] = {case: [] for case in CASES}
    for n in range(repeats + 1):  # (the first round warms the engine's code paths up, untimed)
        first, second = tokens(length), tokens(length)
        measured = [
            (MISS, measure(llm, first + tokens(SUFFIX), MISS, length)),
            (DEVICE, measure(llm, first + tokens(SUFFIX), DEVICE, length)),
            (MISS, measure(llm, second + tokens(SUFFIX), MISS, length)),  # (evicts the first to the tier)
            (TIER, measure(llm, first + tokens(SUFFIX), TIER, length)),
        ]
        for case, ttft in measured if n else ():
            times[case].append(ttft)
    return times


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1024,2048,4096,8064", help="prefix lengths in tokens, whole blocks")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    if any(n <= 0 or n % BLOCK_SIZE for n in lengths):
        parser.error(f"--lengths: each a positive multiple of the block size, {BLOCK_SIZE}")
    source, rng = open_model("smollm2").materialize(), random.Random(0)
    rows, table = [], []
    for length in tqdm(lengths, desc="prefix lengths", unit="length"):
        times = rounds(source, length, args.repeats, rng)
        miss = statistics.median(times[MISS])
        for case in CASES:
            ttft = statistics.median(times[case])
            table.append((length, case, ttft, len(times[case]), miss - ttft))
            what = f"TTFT, {length:,}-token prefix: {case}"
            rows.append(Result("ttft_by_source", what, ttft * 1e3, "ms", ttft / miss, "a miss at the same length"))
    print(f"\nTTFT by where the prefix was found (SmolLM2, one request at a time, {SUFFIX}-token suffix; median)")
    print(f"{'prefix tokens':>13} {'source':<18} {'TTFT ms':>9} {'requests':>9} {'saved vs miss ms':>17}")
    for length, case, ttft, n, saved in table:
        print(f"{length:>13,} {case:<18} {ttft * 1e3:>9.1f} {n:>9} {saved * 1e3:>17.1f}")
    return rows


if __name__ == "__main__":
    record(main)
