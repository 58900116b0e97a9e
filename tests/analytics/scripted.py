"""Scripted runs of the real engine on a virtual clock, for verdicts whose truth is known exactly.

The engine computes for real (SmolLM2, real blocks, real preemptions); only time is scripted: each engine step
advances the clock by `STEP_S + TOKEN_S` per token it computes (times `slow` while a script slows the machine), between
scheduling and the first token, as compute would. Agent steps are written as the SDK records them: a step starts
`CLIENT_S` before its request arrives, runs its own tools after the reply, and, at its deadline, the client hangs up
and the request is aborted there (as `kvobs serve` does on a disconnect).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from instrumented_engine.config import EngineConfig
from instrumented_engine.engine.llm_engine import LLMEngine
from instrumented_engine.engine.stats import StepResult
from instrumented_engine.observers.store import StoreRecorder
from instrumented_engine.sampling_params import SamplingParams
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import StepRecord

BLOCK = 16
STEP_S = 0.02  # an engine step's fixed cost (virtual seconds)
TOKEN_S = 0.001  # and per token it computes
CLIENT_S = 0.01  # the agent's own time before its request arrives


class Clock:
    def __init__(self, start: float | None = None) -> None:
        self.now = float(int(time.time())) if start is None else start  # (durations are exact, times recent)
        self.slow = 1.0  # the machine's speed: step costs are multiplied by it

    def __call__(self) -> float:
        return self.now


@dataclass
class Pending:
    session_id: str
    step_index: int
    request_id: str
    started_at: float
    deadline_s: float | None
    tool_s: float


@dataclass
class Script:
    """One engine on a virtual clock, writing its KV events and requests to a SQLite store, and the agent steps."""

    engine: LLMEngine
    clock: Clock
    recorder: StoreRecorder
    writer: StoreWriter
    store: object
    pending: dict[str, Pending] = field(default_factory=dict)
    outputs: dict[str, object] = field(default_factory=dict)
    raw_events: list = field(default_factory=list)  # the engine's own events, for the truth
    tokens: dict[str, int] = field(default_factory=dict)  # request id -> tokens the model computed for it
    prompts: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, source, path, **config) -> Script:
        clock = Clock()
        config = {"max_model_len": 640, "dtype": "float32", "block_size": BLOCK, **config}
        engine = LLMEngine(EngineConfig(model="smollm2", **config), clock=clock, progress=False, source=source)
        store = open_store(f"sqlite:///{path}")
        writer = StoreWriter(store)
        recorder = StoreRecorder(writer, instance="scripted", block_size=BLOCK, medium="CPU")
        script = cls(engine, clock, recorder, writer, store)
        run = engine.runner.run

        def timed(batch, generators):  # compute takes virtual time: scheduled before it, first token after it
            clock.now += (STEP_S + TOKEN_S * batch.num_scheduled_tokens) * clock.slow
            for item in batch.scheduled:
                script.tokens[item.seq.request_id] = script.tokens.get(item.seq.request_id, 0) + item.num_new_tokens
            return run(batch, generators)

        engine.runner.run = timed
        return script

    def send(
        self,
        session_id: str,
        step_index: int,
        tokens: list[int],
        max_tokens: int,
        *,
        deadline_s: float | None = None,
        tool_s: float = 0.0,
        client_s: float = CLIENT_S,
    ) -> str:
        """An agent step: it starts now, its request arrives `client_s` later (the agent's own queue, the network,
        the server's accept queue)."""
        started = self.clock.now
        self.clock.now += client_s
        rid = f"{session_id}-{step_index}"
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        self.engine.add_request(tokens, params, request_id=rid, session_id=session_id)
        self.prompts[rid] = list(tokens)
        self.pending[rid] = Pending(session_id, step_index, rid, started, deadline_s, tool_s)
        return rid

    def unsent(self, session_id: str, step_index: int, deadline_s: float) -> None:
        """An agent step that starts now and whose request never reaches the server: its client gives up at the
        deadline (the clock moves there) and the engine never hears of it."""
        started = self.clock.now
        self.clock.now += deadline_s
        self._step(
            Pending(session_id, step_index, "", started, deadline_s, 0.0), self.clock.now, "error", "timeout", None, []
        )

    def step(self) -> None:
        self._observe(self.engine.step())
        for rid, p in list(self.pending.items()):
            if p.deadline_s is not None and self.clock.now >= p.started_at + p.deadline_s and rid not in self.outputs:
                self._time_out(p)

    def run_until(self, done) -> None:
        while not done():
            if not self.engine.has_unfinished_requests():
                raise AssertionError("the engine is idle and the script is not done")
            self.step()

    def finish(self) -> None:
        self.run_until(lambda: not self.pending)

    def idle(self, seconds: float) -> None:
        self.clock.now += seconds

    def context(self, rid: str) -> list[int]:
        return self.prompts[rid] + list(self.outputs[rid].output_token_ids)

    def close(self):
        self.writer.close()
        return self.store

    # ---- internals ------------------------------------------------------------------------------
    def _observe(self, result: StepResult) -> None:
        self.raw_events.extend(result.events)
        self.recorder.on_step(result)
        for out in result.outputs:
            if out.finished:
                self.outputs[out.request_id] = out
                p = self.pending.pop(out.request_id, None)
                if p is not None:
                    self._ok(p, out)

    def _ok(self, p: Pending, out) -> None:
        tools = []
        end = self.clock.now + 0.002  # the reply's last bytes reach the agent
        if p.tool_s:
            tools = [{"name": "search", "start": end, "end": end + p.tool_s, "status": "ok", "error_type": None}]
            end += p.tool_s
        late = p.deadline_s is not None and end - p.started_at > p.deadline_s  # its tool ran past the deadline
        self._step(p, end, "error" if late else "ok", "timeout" if late else None, out.first_token_ts, tools)

    def _time_out(self, p: Pending) -> None:
        end = p.started_at + p.deadline_s
        output = self.engine.abort(p.request_id)  # the client hung up at its deadline
        self.pending.pop(p.request_id)
        if output is not None:
            self._observe(StepResult([output], self.engine.current_stats(), self.engine.take_events()))
        self._step(p, end, "error", "timeout", getattr(output, "first_token_ts", None), [])

    def _step(self, p: Pending, end: float, status: str, error: str | None, first_token, tools) -> None:
        ttft = first_token - p.started_at if first_token is not None and first_token == first_token else None
        self.writer.add(
            StepRecord(
                session_id=p.session_id,
                step_index=p.step_index,
                started_at=p.started_at,
                ended_at=end,
                status=status,
                error_type=error,
                ttft_s=ttft,
                e2e_s=end - p.started_at,
                tools=json.dumps(tools) if tools else None,
            )
        )


def verdicts(store):
    """Every step's verdict in a scripted run's store, by (session, step index)."""
    from kvobs.analytics.steps.causes import step_causes

    return step_causes(store, None, None).set_index(["session_id", "step_index"])


def tokens_of(seed: int, n: int) -> list[int]:
    """A prompt of `n` tokens sharing nothing with another seed's."""
    return [1000 + seed * 3000 + (i * 7) % 2900 for i in range(n)]
