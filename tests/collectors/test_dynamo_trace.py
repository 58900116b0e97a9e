"""NVIDIA Dynamo's request trace into the store (`kvobs import dynamo-trace`), on the trace Dynamo 1.6.1's own frontend
wrote for a scripted agent workload through its mocker engine (`tests/fixtures/dynamo-trace/record.py`): a planner
session of three steps with a tool call in each of two pauses, a researcher subagent of two steps with a tool call
between them, a Claude Code request, and a request naming no session."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from collectors.dynamo_trace import DynamoTraceError, import_dynamo_trace
from kvobs.cli import main
from kvobs.store import open_store

TRACE = Path(__file__).parents[1] / "fixtures" / "dynamo-trace" / "request_trace.jsonl"


def _recorded() -> list[dict]:
    """The recording's rows as Dynamo wrote them (its JSONL sink wraps each in an envelope)."""
    return [json.loads(line)["event"] for line in TRACE.read_text().splitlines()]


def test_sessions_steps_pauses_and_requests_as_dynamo_recorded_them(any_store):
    summary = import_dynamo_trace(any_store, [TRACE])
    rows = _recorded()
    ends = [r for r in rows if r["event_type"] == "request_end"]
    assert (summary.rows, summary.requests, summary.sessions, summary.steps, summary.tools) == (10, 7, 3, 6, 3)
    assert not summary.left_out
    sessions = any_store.reads.sessions().set_index("session_id")
    assert sessions["num_steps"].to_dict() == {"trip-planner": 3, "researcher": 2, "cc-5f0b": 1}
    assert sessions["parent_session_id"].dropna().to_dict() == {"researcher": "trip-planner"}
    assert set(sessions["source"]) == {"dynamo"}
    requests = any_store.reads.requests().set_index("request_id")
    for row in ends:  # each request as the row counted it
        request, got = row["request"], requests.loc[row["request"]["request_id"]]
        assert (got["prompt_tokens"], got["cached_tokens"], got["completion_tokens"]) == (
            request["input_tokens"],
            request["cached_tokens"],
            request["output_tokens"],
        )
        assert got["arrival_ts"] == pytest.approx(request["request_received_ms"] / 1000)
        assert got["finished_ts"] - got["arrival_ts"] == pytest.approx(request["total_time_ms"] / 1000, abs=1e-5)
        assert got["first_token_ts"] - got["arrival_ts"] == pytest.approx(request["ttft_ms"] / 1000, abs=1e-5)
        assert got["instance"] == f"worker-{request['worker']['decode_worker_id']}"
    assert requests["session_id"].isna().sum() == 1  # the request that named no session: a request, no step
    steps = any_store.reads.steps().sort_values(["session_id", "step_index"])
    paused = {
        (s, i): [t["name"] for t in json.loads(tools)]
        for s, i, tools in steps[["session_id", "step_index", "tools"]].values
        if isinstance(tools, str)
    }
    assert paused == {
        ("trip-planner", 1): ["search_flights"],
        ("trip-planner", 2): ["book_hotel"],
        ("researcher", 1): ["web_search"],
    }
    later = steps[(steps["session_id"] == "trip-planner") & (steps["step_index"] == 2)].iloc[0]
    assert later["cached_tokens"] > 0  # the planner's prefix, found again by the mocker's own prefix cache


def test_shards_in_any_order_and_gzip_give_the_same_rows_and_a_bad_line_is_left_out_alone(tmp_path):
    lines = TRACE.read_text().splitlines()
    first, second = tmp_path / "trace.000001.jsonl.gz", tmp_path / "trace.000000.jsonl"
    with gzip.open(first, "wt") as f:
        f.write("\n".join(lines[5:]) + "\n")
    second.write_text("\n".join(["not json", json.dumps({"schema": "other.v1"}), *lines[:5]]) + "\n")
    whole, split = open_store(f"sqlite:///{tmp_path / 'whole.db'}"), open_store(f"sqlite:///{tmp_path / 'split.db'}")
    import_dynamo_trace(whole, [TRACE])
    summary = import_dynamo_trace(split, [first, second])
    assert summary.left_out == {"lines that are not JSON": 1, "rows not of dynamo.request.trace.v1": 1}
    for read in ("sessions", "steps", "requests"):
        a, b = getattr(whole.reads, read)(), getattr(split.reads, read)()
        key = {"sessions": ["session_id"], "steps": ["session_id", "step_index"], "requests": ["request_id"]}[read]
        cols = [c for c in a.columns if c != "id"]
        assert a.sort_values(key)[cols].reset_index(drop=True).equals(b.sort_values(key)[cols].reset_index(drop=True))
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"schema": "dynamo.request.trace.v1", "event_type": "tool_end"}) + "\n")
    with pytest.raises(DynamoTraceError, match="no request_end row"):
        import_dynamo_trace(split, [empty])
    whole.close()
    split.close()


def test_kvobs_import_dynamo_trace_stores_it_and_says_what_it_read(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'kvobs.db'}"
    shard = tmp_path / "dynamo-request-trace.000000.jsonl"
    shutil.copy(TRACE, shard)
    assert main(["import", "dynamo-trace", str(shard), "--store", url]) == 0
    out = capsys.readouterr().out
    assert "10 rows: 7 requests, 6 steps of 3 sessions, 3 tool calls" in out
    assert main(["import", "dynamo-trace", "--store", url]) == 2  # no files
    assert "the files follow dynamo-trace" in capsys.readouterr().err
    store = open_store(url)
    assert len(store.reads.steps()) == 6
    store.close()
