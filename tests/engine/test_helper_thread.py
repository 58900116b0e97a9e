"""The engine is built on a helper thread that ends before the server goes on (see helper_thread's docstring)."""

from __future__ import annotations

import threading

import pytest

from instrumented_engine.engine.helper_thread import on_helper_thread


def test_runs_on_another_thread_that_has_ended_and_returns_its_value():
    seen: list[threading.Thread] = []

    def build() -> int:
        seen.append(threading.current_thread())
        return 42

    assert on_helper_thread(build, name="kvobs-load") == 42
    assert seen[0] is not threading.main_thread() and seen[0].name == "kvobs-load"
    assert not seen[0].is_alive()


def test_its_exception_is_raised_in_the_caller():
    def build():
        raise ValueError("the KV cache has 64 blocks")

    with pytest.raises(ValueError, match="64 blocks"):
        on_helper_thread(build, name="kvobs-load")


def test_the_server_loads_its_engine_off_the_main_thread(monkeypatch, smollm2_source):
    import instrumented_engine.server.launcher as launcher

    threads: list[str] = []

    class RecordingEngine(launcher.LLMEngine):
        def __init__(self, *args, **kwargs):
            threads.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(launcher, "LLMEngine", RecordingEngine)
    config = launcher.EngineConfig(num_blocks=80, max_model_len=1024, dtype="float32")
    server = launcher.EngineServer(config, launcher.ServerOptions(), source=smollm2_source, progress=False)
    assert threads == ["kvobs-load"]
    assert isinstance(server.engine.engine, RecordingEngine)
