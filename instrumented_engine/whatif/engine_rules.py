"""When an engine makes a prompt's blocks findable by other requests, by the run's engine (`runs.engine`).

    registers = registers_of(plan.engine)     # AT_ALLOCATION (vLLM's, and an engine not said) or WHEN_COMPUTED

vLLM v1 caches a block as it allocates it, so a request admitted in the same step finds its neighbour's new
prefix; kvobs serve registers a block once its KV is written (`BlockManager.register_computed_blocks`), so a
prompt's blocks are found from its first token on. The what-if's whole-length replay (`whole_length.WholeLengthCache`)
follows the run's engine; a run that says no engine is replayed by vLLM's rule, and the check says so.
"""

from __future__ import annotations

from kvobs.semconv.spans import RunEngine

AT_ALLOCATION, WHEN_COMPUTED = "at_allocation", "when_computed"
REGISTERS = {RunEngine.VLLM.value: AT_ALLOCATION, RunEngine.KVOBS.value: WHEN_COMPUTED}
REGISTERS_WORDS = {
    AT_ALLOCATION: "a prompt's blocks found by others from its lookup on, as vLLM caches a block it allocates",
    WHEN_COMPUTED: "a prompt's blocks found by others from its first token on, as kvobs serve registers a block once "
    "its KV is written",
}


def registers_of(engine: str | None) -> str:
    """When the run's engine makes a prompt's blocks findable (`REGISTERS`; vLLM's rule where the run says none)."""
    return REGISTERS.get(engine or "", AT_ALLOCATION)
