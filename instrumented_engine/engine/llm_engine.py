"""The engine: requests in, one `step()` at a time, outputs + stats + KV events out.

    step = schedule -> run the model -> mark KV computed and register full blocks -> postprocess

No OpenTelemetry, HTTP or store here: `step()` returns plain data for adapters to consume.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

import torch

from instrumented_engine.config import SELF_DESCRIBING, CacheLayout, EngineConfig, check_context_length
from instrumented_engine.engine.detokenizer import IncrementalText
from instrumented_engine.engine.events import CacheCleared, Invalidated
from instrumented_engine.engine.kv_cache.eviction import make_eviction_policy
from instrumented_engine.engine.kv_cache.manager import BlockManager
from instrumented_engine.engine.model_runner import ModelRunner
from instrumented_engine.engine.precision import choose_dtype
from instrumented_engine.engine.scheduler import Scheduler, SchedulerOutput
from instrumented_engine.engine.sequence import Sequence
from instrumented_engine.engine.stats import RequestOutput, RequestStart, SchedulerStats, StepResult
from instrumented_engine.models.loader import ModelSource, open_model
from instrumented_engine.sampling_params import SamplingParams
from kvobs.semconv.metrics import FINISHED_ERROR

log = logging.getLogger(__name__)


def resolve_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for but no CUDA device is available")
    name, why = choose_dtype(config.dtype, torch.device(device))
    if device == "cpu" and name == "float16":
        raise ValueError("float16 is not supported on CPU; use float32 or bfloat16")
    log.info("computing in %s on %s: %s", name, device, why)
    return torch.device(device), getattr(torch, name)


class LLMEngine:
    """Paged-KV inference with vLLM V1's block-manager semantics.

    Args:
        config: what to run (see `EngineConfig`).
        clock: epoch-seconds time source for events and timings.
        progress: show a progress bar while the weights load.
        source: an already opened model (`open_model(...).materialize()`) instead of `config.model`.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        clock: Callable[[], float] = time.time,
        progress: bool = True,
        source: ModelSource | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        device, dtype = resolve_device_dtype(config)
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        log.info("%d compute threads", torch.get_num_threads())
        source = source or open_model(config.model)
        self.model_config = source.config
        self.model_name = source.name
        self.tokenizer = source.tokenizer
        self.layout = CacheLayout.derive(
            config,
            bytes_per_token=source.config.kv_bytes_per_token(dtype.itemsize),
            model_context=source.config.max_position_embeddings,
        )
        policy = make_eviction_policy(config.eviction_policy, ttl_s=config.session_ttl_s)
        self.block_manager = BlockManager(
            self.layout.num_blocks,
            self.layout.block_size,
            enable_caching=config.enable_prefix_caching,
            policy=policy,
            clock=clock,
            session_end_after_s=config.session_end_after_s,
            offload_blocks=self.layout.num_offload_blocks,
            describe_offloads=config.kv_offload_events == SELF_DESCRIBING,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            clock=clock,
        )
        self.runner = ModelRunner(
            source, self.layout, dtype=dtype, device=device, progress=progress, batch_hint=config.max_num_seqs
        )
        self.sequences: dict[str, Sequence] = {}
        self._generators: dict[str, torch.Generator] = {}
        self._texts: dict[str, IncrementalText] = {}  # request id -> its output text so far
        self._default_generator = torch.Generator(device=device).manual_seed(config.seed)
        self._ids = itertools.count()

    # ---- requests -------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        session_id: str | None = None,
        adapter: str | None = None,
        arrival_ts: float | None = None,
        trace_headers: dict[str, str] | None = None,
        parent_session_id: str | None = None,
    ) -> str:
        """Queue a request; returns its id. `trace_headers` (W3C `traceparent`/`tracestate`) come back on
        its outputs untouched, for whoever makes its span.

        Raises:
            ValueError: empty prompt, prompt + max_tokens beyond the context, a duplicate id, or a
                prompt larger than one step's budget while chunked prefill is off.
        """
        params = params or SamplingParams()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        bad = [t for t in token_ids if not 0 <= t < self.model_config.vocab_size]
        if bad:
            raise ValueError(
                f"prompt has token ids outside the vocabulary (0..{self.model_config.vocab_size - 1}): {bad[:5]}"
            )
        check_context_length(len(token_ids), params.max_tokens, self.layout.max_model_len)
        if not self.config.enable_chunked_prefill and len(token_ids) > self.config.max_num_batched_tokens:
            raise ValueError(
                f"prompt has {len(token_ids):,} tokens, more than max_num_batched_tokens="
                f"{self.config.max_num_batched_tokens:,}, and chunked prefill is off"
            )
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self.sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        seq = Sequence(
            request_id,
            token_ids,
            params,
            arrival_ts or self.clock(),
            session_id=session_id,
            parent_session_id=parent_session_id,
            adapter=adapter,
            trace_headers=trace_headers or None,
        )
        if params.seed is not None:
            self._generators[request_id] = torch.Generator(device=self.runner.device).manual_seed(params.seed)
        elif not params.greedy:
            self._generators[request_id] = self._default_generator
        self.sequences[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free its blocks; returns its final output, None if unknown or finished."""
        seq = self.sequences.get(request_id)
        if seq is None or seq.is_finished:
            return None
        self.scheduler.finish(seq, "abort")
        self._forget(seq)
        return self._output(seq, [], self.tokenizer.decode(seq.output_token_ids))

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished

    # ---- the step ------------------------------------------------------------------------------
    def step(self) -> StepResult:
        batch = self.scheduler.schedule()
        self._copy_tier(load=True)  # prefixes found in the offload tier, into the cache before the model reads them
        sampled = self.runner.run(batch, self._generators) if not batch.is_empty else {}
        self.scheduler.mark_computed(batch)
        self._copy_tier(load=False)  # the step's new full blocks, written through to the tier
        outputs = self._postprocess(batch, sampled)
        started = [RequestStart(s.request_id, s.session_id, s.arrival_ts, s.trace_headers) for s in batch.started]
        return StepResult(outputs, self._stats(batch), self.scheduler.take_events(), started)

    def _copy_tier(self, *, load: bool) -> None:
        bm = self.block_manager
        copies = bm.tier_loads if load else bm.tier_stores
        for copy in copies:
            num_bytes, seconds = self.runner.copy_tier(copy, load=load)
            (bm.tier_loaded if load else bm.tier_stored)(copy, num_bytes, seconds)
        copies.clear()

    def _postprocess(self, batch: SchedulerOutput, sampled: dict[str, int | Exception]) -> list[RequestOutput]:
        outputs = []
        now = self.clock()
        for item in batch.scheduled:
            seq = item.seq
            token = sampled.get(seq.request_id)
            if token is None:
                continue  # a prefill chunk that did not reach the prompt's end
            try:
                if isinstance(token, Exception):
                    raise token
                seq.token_ids.append(token)
                if seq.first_token_ts is None:
                    seq.first_token_ts = now
                text, reason = self._check_stop(seq, token)
            except Exception:  # sampling, detokenizing or a stop string failed for this request: it fails alone
                log.exception("request %s failed in the engine; ending it alone", seq.request_id)
                self.scheduler.finish(seq, FINISHED_ERROR)
                self._forget(seq)
                outputs.append(self._output(seq, [], ""))
                continue
            if reason is not None:
                self.scheduler.finish(seq, reason)
            outputs.append(self._output(seq, [token], text))
            if reason is not None:
                self._forget(seq)
        return outputs

    def _check_stop(self, seq: Sequence, token: int) -> tuple[str, str | None]:
        sp = seq.sampling_params
        texts = self._texts.get(seq.request_id)
        if texts is None:
            texts = self._texts[seq.request_id] = IncrementalText(self.tokenizer)
        output = seq.output_token_ids
        text = texts.extend(output)
        if (not sp.ignore_eos and token == self.tokenizer.eos_token_id) or token in sp.stop_token_ids:
            return texts.final(output), "stop"
        for stop in sp.stop:
            cut = text.find(stop)
            if cut != -1:
                return text[:cut], "stop"
        if len(output) >= sp.max_tokens:
            return texts.final(output), "length"
        return text, None

    def _output(self, seq: Sequence, new_tokens: list[int], text: str) -> RequestOutput:
        return RequestOutput(
            request_id=seq.request_id,
            session_id=seq.session_id,
            parent_session_id=seq.parent_session_id,
            new_token_ids=new_tokens,
            output_token_ids=seq.output_token_ids,
            text=text,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_preemptions=seq.num_preemptions,
            arrival_ts=seq.arrival_ts,
            scheduled_ts=seq.scheduled_ts,
            first_token_ts=seq.first_token_ts,
            finished_ts=seq.finished_ts,
            trace_headers=seq.trace_headers,
            max_tokens=seq.sampling_params.max_tokens,
            temperature=seq.sampling_params.temperature,
            top_p=seq.sampling_params.top_p,
            session_blocks=self._session_blocks(seq),
        )

    def _session_blocks(self, seq: Sequence) -> int | None:
        """A finished request's session residency: the cached blocks its session stored or hit, now."""
        if not seq.is_finished or seq.session_id is None:
            return None
        return self.block_manager.session_blocks.get(seq.session_id, 0)

    def _forget(self, seq: Sequence) -> None:
        self.sequences.pop(seq.request_id, None)
        self._generators.pop(seq.request_id, None)
        self._texts.pop(seq.request_id, None)

    def current_stats(self) -> SchedulerStats:
        """The engine's state between steps (nothing scheduled)."""
        return self._stats(SchedulerOutput())

    def _stats(self, batch: SchedulerOutput) -> SchedulerStats:
        bm = self.block_manager
        decode = sum(1 for s in batch.scheduled if s.num_new_tokens == 1)
        scheduled = batch.num_scheduled_tokens
        return SchedulerStats(
            ts=self.clock(),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_blocks_total=bm.num_usable_blocks,
            num_blocks_free=bm.num_free_blocks,
            num_blocks_resident=bm.num_resident_blocks,
            kv_cache_usage=bm.usage,
            num_scheduled_tokens=scheduled,
            num_prefill_tokens=scheduled - decode,
            num_decode_tokens=decode,
            num_preempted=len(batch.preempted),
            num_idle_losses_pending=bm.activity.num_pending,
        )

    # ---- cache control -----------------------------------------------------------------------------
    def invalidate(
        self, reason: str, *, session_id: str | None = None, adapter: str | None = None
    ) -> Invalidated | CacheCleared | None:
        """Invalidate cached blocks (see `BlockManager.invalidate`); None when a reset is refused."""
        return self.block_manager.invalidate(reason, session_id=session_id, adapter=adapter)

    def reset_prefix_cache(self) -> bool:
        """vLLM's reset: succeeds only while no block is in use."""
        return self.block_manager.reset() is not None

    def release_session(self, session_id: str) -> int:
        return self.block_manager.release_session(session_id)

    def take_events(self):
        """Events emitted outside `step()` (invalidations, resets, releases)."""
        return self.scheduler.take_events()
