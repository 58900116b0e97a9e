"""The engine thread behind the server: requests that arrive together at an idle engine start in one step."""

from __future__ import annotations

import asyncio

import pytest

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.async_engine import AsyncEngine
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.sampling_params import SamplingParams


class FirstSteps:
    """Records how many requests each step started."""

    def __init__(self) -> None:
        self.started: list[int] = []

    def on_step(self, result) -> None:
        if result.started:
            self.started.append(len(result.started))


async def _send_together(engine: AsyncEngine, n: int, pause_s: float) -> list[str]:
    async def one(i: int) -> str:
        await asyncio.sleep(i * pause_s)  # clients a little apart, as over HTTP
        stream = await engine.add_request(
            [1, 2, 3, 4 + i], SamplingParams(temperature=0, max_tokens=2), request_id=f"r{i}"
        )
        return "".join([out.text async for out in stream])

    return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.mark.parametrize(("window_s", "together"), [(0.5, True), (0.0, False)])
def test_requests_arriving_together_are_prefilled_together(smollm2_source, window_s, together):
    """Four clients 50 ms apart: within a 500 ms window all four start in the first step; with none, the first
    starts alone (a 2-core machine would have to stall the engine thread 50 ms for it to see the second)."""
    engine = LLMEngine(EngineConfig(num_blocks=32, max_model_len=64), source=smollm2_source, progress=False)
    steps = FirstSteps()
    async_engine = AsyncEngine(engine, observers=[steps], batch_window_s=window_s)
    async_engine.start()
    try:
        texts = asyncio.run(_send_together(async_engine, 4, pause_s=0.05))
    finally:
        async_engine.stop()
    assert len(texts) == 4 and sum(steps.started) == 4
    assert (steps.started == [4]) is together, steps.started  # without a window the first starts alone
