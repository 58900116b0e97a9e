"""The observed requests as Mooncake rows (`kvobs export mooncake`), on the recorded vLLM 0.32 run (agents through the
kvobs SDK; vLLM's own KV events and the cached tokens its replies gave): the hash ids explain every hit vLLM
reported, a session's requests wait for each other with their tool waits, and the two flavors differ only as said."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kvobs.analytics.steps.response_usage import response_cached_tokens
from kvobs.cli import main
from kvobs.formats.mooncake import AGENTIC, AIPERF, FRESH_IDS, mooncake_rows


def test_hash_ids_explain_every_hit_vllm_reported(vllm_run):
    trace = mooncake_rows(vllm_run.store)
    all_requests = vllm_run.store.reads.requests()
    requests = all_requests.drop_duplicates("request_id").set_index("request_id")
    assert len(trace.rows) + trace.skipped == len(requests) and len(trace.rows) > 0
    said = response_cached_tokens(all_requests, vllm_run.store.reads.steps())  # what vLLM's replies said it found
    # a hit is a block stored before the request came: in an earlier row's prompt, or filled by an earlier reply's
    # tokens (a Mooncake row lists its prompt's blocks only: a replay caches what its own replies fill, under ids of
    # its own, so those hits are the format's to lose; counted here, said in the docs)
    first_stored = vllm_run.store.reads.stored_blocks().groupby("block_hash")["ts"].min()
    by_id = {i: h for h, i in trace.ids.items()}
    seen: set[int] = set()
    explained = from_replies = 0
    for row in trace.rows:
        assert len(row["hash_ids"]) == math.ceil(row["input_length"] / trace.block_size)
        cached = said.get(row["request_id"])
        arrival = requests.loc[row["request_id"], "arrival_ts"]
        leading = 0
        for i in row["hash_ids"]:
            if i in seen:
                leading += 1
            elif i in by_id and first_stored.get(by_id[i], arrival) < arrival:
                leading, from_replies = leading + 1, from_replies + 1
            else:
                break
        if cached is not None:  # the ids reach at least as far as vLLM found
            assert leading * trace.block_size >= cached, row
            explained += cached > 0
        seen.update(h for h in row["hash_ids"] if h < FRESH_IDS)
    assert explained > 0 and from_replies > 0


@pytest.mark.parametrize("run", ["vllm_run", "agent_run"])
def test_a_sessions_requests_wait_for_each_other_with_their_tool_calls(run, request):
    """Each request of a session waits for the one before it; its pause is split into the tool calls in it (the
    engine run's SDK steps ran a tool after each call) and the rest, adding up to the pause as recorded."""
    store = request.getfixturevalue(run).store
    trace = mooncake_rows(store)
    requests = store.reads.requests().drop_duplicates("request_id").set_index("request_id")
    by_session: dict[str, list[dict]] = {}
    for row in trace.rows:
        by_session.setdefault(row.get("session_id"), []).append(row)
    assert len([s for s in by_session if s is not None]) > 1
    for session, rows in by_session.items():
        if session is None:
            continue
        assert "timestamp" in rows[0] and "wait_for" not in rows[0]
        for before, row in zip(rows, rows[1:]):
            assert row["wait_for"] == [before["request_id"]] and "timestamp" not in row
            gap = requests.loc[row["request_id"], "arrival_ts"] - requests.loc[before["request_id"], "finished_ts"]
            assert row["delay"] + row["tool_wait_ms"] == pytest.approx(max(gap, 0) * 1000, abs=0.01)
    waits = [row["tool_wait_ms"] for row in trace.rows if "tool_wait_ms" in row]
    assert (max(waits) > 0) == (run == "agent_run")  # the recorded vLLM run's SDK recorded no tool calls


def test_aiperf_rows_carry_the_whole_pause_as_delay_and_no_agentic_fields(vllm_run):
    agentic, aiperf = mooncake_rows(vllm_run.store, flavor=AGENTIC), mooncake_rows(vllm_run.store, flavor=AIPERF)
    assert len(agentic.rows) == len(aiperf.rows)
    for a, b in zip(agentic.rows, aiperf.rows):
        assert not {"request_id", "wait_for", "tool_wait_ms"} & set(b)
        assert a["hash_ids"] == b["hash_ids"] and a.get("timestamp") == b.get("timestamp")
        if "delay" in a:
            assert b["delay"] == pytest.approx(a["delay"] + a["tool_wait_ms"], abs=0.01)


def test_kvobs_export_mooncake_writes_the_rows_and_says_the_block_size(vllm_run, tmp_path, capsys):
    out = tmp_path / "trace.jsonl"
    assert main(["export", "mooncake", "--store", vllm_run.url, "-o", str(out)]) == 0
    said = capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == mooncake_rows(vllm_run.store).rows
    assert (
        f"{len(rows):,} requests as agentic Mooncake rows" in said
        and f"blocks of {mooncake_rows(vllm_run.store).block_size} tokens" in said
    )
    assert main(["export", "mooncake", "--store", f"sqlite:///{tmp_path / 'none.db'}"]) == 2


RECORDED = Path(__file__).parents[1] / "fixtures" / "mooncake"


@pytest.mark.parametrize("flavor", [AGENTIC, AIPERF])
def test_aiperfs_own_loader_read_every_row_as_exported(vllm_run, flavor):
    """AIPerf 0.13's Mooncake loader (in its own environment: `record_aiperf.py`) took every row of the export and
    read each field as written; the export of the same run now is that file, row for row."""
    recorded = [json.loads(line) for line in (RECORDED / f"vllm-0.32-{flavor}.jsonl").read_text().splitlines()]
    assert mooncake_rows(vllm_run.store, flavor=flavor).rows == recorded
    read = json.loads((RECORDED / "aiperf_read.json").read_text())
    assert read["aiperf_version"] == "0.13.0" and len(read[flavor]) == len(recorded)
    for row, parsed in zip(recorded, read[flavor]):
        assert parsed["can_load"] and parsed["session_id"] == row.get("session_id")
        fields = ("input_length", "output_length", "hash_ids", "timestamp", "delay")
        assert [parsed[k] for k in fields] == [row.get(k) for k in fields]
