"""Per-step statistics and request outputs: plain data returned by `LLMEngine.step()`."""

from __future__ import annotations

from dataclasses import dataclass, field

from instrumented_engine.engine.events import KVEvent


@dataclass(frozen=True)
class SchedulerStats:
    """The engine's state after one step (what vLLM's SchedulerStats carries, plus residency)."""

    ts: float
    num_running: int
    num_waiting: int
    num_blocks_total: int  # usable blocks (the null block excluded)
    num_blocks_free: int
    num_blocks_resident: int  # cached and unreferenced
    kv_cache_usage: float  # pinned fraction, vLLM's meaning
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_idle_losses_pending: int = 0  # (session, block) losses of idle sessions whose verdict is not known yet


@dataclass(frozen=True)
class RequestLatencies:
    """A finished request's phases in seconds (vLLM's definitions); None for a phase it never reached."""

    e2e: float | None = None  # arrival -> finish
    ttft: float | None = None  # arrival -> first token
    queue: float | None = None  # arrival -> first scheduled
    inference: float | None = None  # first scheduled -> finish
    prefill: float | None = None  # first scheduled -> first token
    decode: float | None = None  # first token -> finish


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request."""

    request_id: str
    session_id: str | None
    new_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int | None  # its prefix hit at admission; None: never admitted (aborted while queued)
    num_preemptions: int
    arrival_ts: float
    scheduled_ts: float | None
    first_token_ts: float | None
    finished_ts: float | None
    trace_headers: dict[str, str] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    session_blocks: int | None = None  # on a finished request: cached blocks its session stored or hit, now
    parent_session_id: str | None = None  # the session that started its session (a subagent's caller)

    def latencies(self) -> RequestLatencies:
        end, first, scheduled = self.finished_ts, self.first_token_ts, self.scheduled_ts
        if end is None:
            return RequestLatencies()
        ttft = None if first is None else first - self.arrival_ts
        if scheduled is None:  # never ran (refused or aborted while queued)
            return RequestLatencies(e2e=end - self.arrival_ts, ttft=ttft)
        return RequestLatencies(
            e2e=end - self.arrival_ts,
            ttft=ttft,
            queue=scheduled - self.arrival_ts,
            inference=end - scheduled,
            prefill=None if first is None else first - scheduled,
            decode=None if first is None else end - first,
        )


@dataclass(frozen=True)
class RequestStart:
    """A request scheduled for the first time this step: who sees it first can decide whether to trace it."""

    request_id: str
    session_id: str | None
    arrival_ts: float
    trace_headers: dict[str, str] | None = None


@dataclass(frozen=True)
class StepResult:
    outputs: list[RequestOutput]
    stats: SchedulerStats
    events: list[KVEvent] = field(default_factory=list)
    started: list[RequestStart] = field(default_factory=list)
