"""The replay's units: a request as the replay takes it, the tensor-free sequence it becomes, the replay's clock
and what a replay counts (`WhatIfResult`), shared by the single-cache replay (`whatif.replay`), the whole-length
cache (`whatif.whole_length`) and the fleet's (`whatif.fleet`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class ReplayRequest:
    request_id: str
    session_id: str | None
    arrival_ts: float
    finished_ts: float
    prompt_tokens: int
    total_tokens: int
    chain: tuple[int, ...]
    received_ts: float | None = None  # when it reached the engine (arrival_ts is when it looked its prefix up)
    first_token_ts: float | None = None  # its first output token (its decode's blocks are taken from then on)


@dataclass
class WhatIfResult:
    num_blocks: int
    policy: str
    requests: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    evicted_blocks: int = 0  # blocks lost, each once (as `reads.block_losses` counts the observed ones)
    released_blocks: int = 0  # blocks their session released: no loss, counted apart
    by_reason: dict[str, int] = field(default_factory=dict)  # blocks dropped per eviction reason (releases too)
    lost_in_pause_blocks: int = 0  # (session, block) losses in a tool pause: the session came back after
    lost_after_end_blocks: int = 0  # ... after the session's last request
    recompute_tokens: int = 0
    tier_blocks: int = 0  # the offload tier below the cache (0: none)
    tier_hit_tokens: int = 0  # prompt tokens loaded from it (in `hit_tokens` too: they were not computed)
    saved_in_pause_blocks: int = 0  # of `lost_in_pause_blocks`, those the session's next request loaded back
    waited: int = 0
    preemptions: int = 0  # running requests the replay preempted to make room (the recorded replay only)
    too_large: int = 0  # requests longer than the whole cache: not admitted
    request_hits: dict[str, int] = field(default_factory=dict)  # request id -> its `hit_tokens` (first admission)
    request_loads: dict[str, int] = field(default_factory=dict)  # ... of them, loaded from the tier (where any)
    ttl_s: float | None = None  # session_ttl's protection of a paused session's blocks (None: the policy keeps none)

    @property
    def configuration(self) -> str:
        """How the table names it: the policy, and its TTL where it keeps one."""
        return self.policy if self.ttl_s is None else f"{self.policy} {self.ttl_s:g} s"

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None


class ReplayClock:
    """The replay's time: the block manager reads it as its clock; the replay sets it as events come due."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_sequence(req: ReplayRequest, key: tuple, block_size: int) -> Sequence:
    """A tensor-free sequence whose block hashes are the recorded chain (unknown tail blocks get unique hashes)."""
    seq = Sequence(
        req.request_id, [0] * req.prompt_tokens, SamplingParams(max_tokens=1), req.arrival_ts, session_id=req.session_id
    )
    seq.hash_key = key
    hashes = [h.to_bytes(8, "big") for h in req.chain[: req.total_tokens // block_size]]
    for i in range(len(hashes), req.total_tokens // block_size):
        hashes.append(f"{req.request_id}/{i}".encode())  # content never seen: unique to this request
    seq.block_hashes = hashes
    return seq
