"""docs/agents.md's recipes run as written: each `<!-- recipe: NAME -->` block, with only the server's and the
collector's addresses changed, is an agent process against a real `kvobs serve` and `kvobs collect`; its
conversations become sessions and every answered step is tied to its server request."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvobs.semconv.spans import STEP_JOINED
from kvobs.store import open_store
from tests.collectors.agent_harness import AGENT_VENVS, served_and_collected

ROOT = Path(__file__).resolve().parents[2]
RECIPES = dict(
    re.findall(r"<!-- recipe: ([\w-]+) -->\n```python\n(.*?)```", (ROOT / "docs/agents.md").read_text(), re.S)
)
SERVER, COLLECTOR = "http://localhost:8000/v1", "http://localhost:4318/v1/traces"


def test_every_recipe_names_the_two_addresses_it_is_run_with():
    frameworks = {"langchain", "openai-agents", "smolagents", "agno", "llamaindex", "pydantic-ai", "openai-v2"}
    assert set(RECIPES) == frameworks
    for code in RECIPES.values():
        assert SERVER in code and COLLECTOR in code and code.startswith("# pip install ")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_recipe_as_written_makes_sessions_whose_steps_are_joined(smollm2_source, tmp_path, name):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    with served_and_collected(smollm2_source, store, max_model_len=512) as h:
        script = tmp_path / f"recipe_{name}.py"  # (never a package's own name: smolagents.py)
        script.write_text(RECIPES[name].replace(SERVER, h.server.url + "/v1").replace(COLLECTOR, h.otlp_http))
        python = AGENT_VENVS[name] / "bin" / "python" if name in AGENT_VENVS else sys.executable
        done = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-4000:]
        h.served = 4  # two conversations of two calls: every request span is awaited
    steps = store.reads.steps().sort_values(["session_id", "step_index"])
    assert steps.groupby("session_id").size().to_dict() == {"trip-lisbon": 2, "trip-oslo": 2}
    assert set(steps["status"]) == {"ok"} and steps["request_join"].isin(STEP_JOINED).all()
    requests = store.reads.requests()
    assert sorted(steps["request_id"]) == sorted(requests["request_id"])  # each request, once
