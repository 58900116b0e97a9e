"""`kvobs import`: a recorded capture replayed through the collector's own parts makes the store a live collector
made of the same recording (its scrapes served over HTTP, its KV-event frames published over ZMQ, its OTLP bodies
POSTed: the `vllm_run`, `vllm_fleet` and `served_fleet` stores), on every backend; a folder that holds no capture, or
a line that is no recorded message, is refused with the file and line named, and nothing is written. (One thing
differs, by design: the collector's jobs run on the capture's clock, every `--interval` of it, where the live
fixtures' ran once, at their stop; so more requests learn their session from a step that came before them.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from collectors.capture import CaptureError, import_capture
from kvobs.semconv.spans import RunEngine
from kvobs.store import open_store
from tests.collectors.fleet_recording import ROOT as SERVED_FLEET
from tests.collectors.fleet_recording import VLLM_FLEET
from tests.collectors.recorded import FIXTURES as VLLM_RUN

KEYS = {  # table -> (its key, the columns compared)
    "requests": (
        ["request_id"],
        ["instance", "prompt_tokens", "cached_tokens", "cached_from", "arrival_ts", "finished_ts"],
    ),
    "steps": (["session_id", "step_index"], ["status", "error_type", "request_id", "request_join", "cached_tokens"]),
    "runs": (["run_id"], ["instance", "num_blocks", "block_size", "engine"]),
}


def rows(store, table: str) -> pd.DataFrame:
    key, columns = KEYS[table]
    frame = {"requests": store.reads.requests, "steps": store.reads.steps, "runs": store.reads.runs}[table]()
    frame = frame[key + columns].sort_values(key).reset_index(drop=True).astype(object)
    return frame.where(frame.notna(), None)


def kv_counts(store) -> dict:
    events = store.reads.kv_events()
    return events.groupby(["instance", "kind"]).size().to_dict()


@pytest.mark.parametrize(
    "capture,live,instance",
    [(VLLM_RUN, "vllm_run", "vllm-cpu"), (VLLM_FLEET, "vllm_fleet", None), (SERVED_FLEET, "served_fleet", None)],
    ids=["vllm-0.32", "vllm-fleet", "served-fleet"],
)
def test_an_imported_capture_is_the_store_a_live_collector_made_of_it(any_store, request, capture, live, instance):
    summary = import_capture(any_store, capture, instance=instance)
    made = request.getfixturevalue(live).store
    assert summary.exports == sum(1 for _ in (capture / "otlp_traces.jsonl").open())
    for table in KEYS:
        pd.testing.assert_frame_equal(rows(any_store, table), rows(made, table), check_dtype=False, obj=table)
    assert kv_counts(any_store) == kv_counts(made)
    # the collector's jobs ran on the capture's clock (the live run's ran once, at its stop): a request whose step
    # claimed it (by its reply's id, or its trace) before its span came names that step's session, and only that one
    requests, steps = any_store.reads.requests(), any_store.reads.steps()
    named = requests.dropna(subset=["session_id"])
    claimed = {
        **dict(zip(steps["trace_id"], steps["session_id"])),
        **dict(zip(steps["request_id"], steps["session_id"])),
    }
    assert [claimed.get(r) or claimed.get(t) for r, t in zip(named["request_id"], named["trace_id"])] == list(
        named["session_id"]
    )
    assert set(rows(any_store, "runs")["engine"]) == {RunEngine.KVOBS.value if live == "served_fleet" else "vllm"}


def test_the_agents_own_steps_are_stored_with_the_capture(tmp_path):
    """vLLM 0.32's capture holds the workload's own record of its steps: 56 answered, one refused with its status."""
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    summary = import_capture(store, VLLM_RUN, instance="vllm-cpu")
    steps = store.reads.steps()
    assert summary.agent_steps == len(steps) == 57
    assert steps.loc[steps["status"] == "error", "error_type"].tolist() == ["400"]
    assert summary.describe() == "vllm-cpu: 125 KV-event messages, 238 scrapes; 48 OTLP exports; 57 agent steps"


def test_a_folder_without_a_capture_or_with_a_bad_line_is_refused_and_nothing_is_written(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CaptureError, match="holds no capture"):
        import_capture(store, empty)
    bad = tmp_path / "bad"
    bad.mkdir()
    good = (VLLM_RUN / "kv_events.jsonl").read_text().splitlines()[:2]
    (bad / "kv_events.jsonl").write_text("\n".join([*good, json.dumps({"recv_ts": 1.0})]) + "\n")
    with pytest.raises(CaptureError, match=r"kv_events.jsonl:3: not a recorded KV-event message"):
        import_capture(store, bad)
    assert store.reads.kv_events().empty and store.reads.requests().empty


def test_kvobs_import_prints_what_it_read_and_refuses_a_folder_with_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "import", str(VLLM_FLEET), "--store", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "replica-a: 7 KV-event messages, 12 scrapes; replica-b: 8 KV-event messages, 12 scrapes" in done.stdout
    # what `kvobs doctor --collector` would have said of the collector that took it: each batch's lag as recorded
    # (its receipt less its own time, not days late against today's clock), and every reply's count taken
    for replica in ("replica-a", "replica-b"):
        assert f"  ok  {replica}: wire: array batch, map events; latest batch 0.00 s old on arrival\n" in done.stdout
    assert "of 24 joined requests whose own span said no cached tokens, 24 took the count" in done.stdout
    assert "PROBLEM" not in done.stdout
    assert len(open_store(url, must_exist=True).reads.requests()) == 24
    refused = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "import", str(tmp_path), "--store", url],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        refused.returncode == 2
        and refused.stderr.strip().startswith("kvobs import: ")
        and "Traceback" not in (refused.stderr)
    )
