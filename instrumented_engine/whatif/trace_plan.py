"""A Mooncake trace as a replay plan (`kvobs whatif --trace FILE`): each row a request holding its whole length from
its lookup to its finish through the same whole-length cache as a recorded vLLM run (`whatif.replay`), its hash ids
its chain.

    plan = trace_plan(read_trace(lines, rates), block_size=16)
    print(simulate(plan, num_blocks=64).hit_rate)

A trace has no observed figures and no engine runs: it is one replay, from an empty cache, of what its rows say.
"""

from __future__ import annotations

from instrumented_engine.whatif.replay import ReplayPlan
from instrumented_engine.whatif.units import ReplayRequest
from kvobs.formats.mooncake_trace import Trace


def trace_plan(trace: Trace, block_size: int) -> ReplayPlan:
    """The trace's requests as the replay takes them (`ReplayRequest`), one id a block of `block_size` tokens."""
    requests = [
        ReplayRequest(
            r.request_id,
            r.session_id,
            r.lookup_s,
            r.finished_s,
            r.input_length,
            r.input_length + r.output_length,
            r.hash_ids,
            r.lookup_s,
            r.first_token_s,
        )
        for r in trace.requests
    ]
    return ReplayPlan(requests, block_size)
