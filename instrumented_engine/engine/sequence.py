"""A request as the scheduler sees it: tokens, progress, and its block table."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from instrumented_engine.engine.kv_cache.hashing import BlockHash
from instrumented_engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request. `token_ids` is prompt + output; `num_computed_tokens` have their KV in the cache.

    `block_hashes` are the chained hashes of the full blocks of `token_ids`, computed under
    `hash_key` (weights and adapter versions); a changed key means they must be recomputed.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_ts: float
    session_id: str | None = None
    parent_session_id: str | None = None  # the session that started this one, passed through to the store
    adapter: str | None = None
    trace_headers: dict[str, str] | None = None  # W3C trace context of the caller, passed through untouched
    token_ids: list[int] = field(init=False)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks of block_table already in the hash map
    num_offered_blocks: int = 0  # leading full blocks already offered to the offload tier (stored or held there)
    block_hashes: list[BlockHash] = field(default_factory=list)
    hash_key: tuple = ()
    num_cached_tokens: int | None = None  # prefix hit at first admission
    num_preemptions: int = 0
    scheduled_ts: float | None = None
    first_token_ts: float | None = None
    finished_ts: float | None = None
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling_params.max_tokens
