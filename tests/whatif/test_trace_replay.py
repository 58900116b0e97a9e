"""`kvobs whatif --trace FILE`: a Mooncake trace replayed through the same what-if. The round trip (a recorded run
exported as agentic Mooncake rows and replayed gives the table the run itself gives), and the times a trace without
kvobs's fields is replayed at, worked by hand."""

from __future__ import annotations

import json

import pytest

from instrumented_engine.whatif.replay import simulate
from instrumented_engine.whatif.runs import replay_plans
from instrumented_engine.whatif.trace_plan import trace_plan
from kvobs.formats.mooncake import mooncake_rows
from kvobs.formats.mooncake_trace import ServiceRates, TraceError, read_trace

COMPARED = (
    "requests",
    "query_tokens",
    "hit_tokens",
    "evicted_blocks",
    "released_blocks",
    "lost_in_pause_blocks",
    "lost_after_end_blocks",
    "recompute_tokens",
    "waited",
    "too_large",
)


@pytest.mark.parametrize("policy", ["lru", "session_ttl"])
def test_a_run_exported_and_replayed_is_the_run_replayed(vllm_run, policy):
    (plan,) = replay_plans(vllm_run.store)
    exported = mooncake_rows(vllm_run.store)
    assert exported.block_size == plan.block_size and exported.skipped < len(exported.rows)
    trace = read_trace(exported.jsonl().splitlines())
    assert trace.recorded == len(trace.requests) and trace.modeled == 0 and trace.rates is None
    replayed = trace_plan(trace, exported.block_size)
    assert len(replayed.requests) == len(plan.requests)
    observed_size = plan.observed["num_blocks"]
    for num_blocks in (observed_size // 4, observed_size // 2, observed_size):
        run = simulate(plan, num_blocks=num_blocks, policy=policy, ttl_s=5.0)
        back = simulate(replayed, num_blocks=num_blocks, policy=policy, ttl_s=5.0)
        assert {f: getattr(back, f) for f in COMPARED} == {f: getattr(run, f) for f in COMPARED}, num_blocks
    assert run.hit_tokens > 0 and simulate(plan, num_blocks=observed_size // 4, policy=policy).evicted_blocks > 0


def _lines(*rows: dict) -> list[str]:
    return [json.dumps(row) for row in rows]


def test_a_trace_without_times_is_replayed_at_the_rates_given():
    """A session's second request arrives its delay plus its tool wait after the first finished; a row that waits
    for nothing arrives at its timestamp; each runs its prompt at the prefill rate, then its reply at the decode
    rate."""
    lines = _lines(
        {"timestamp": 0, "input_length": 1000, "output_length": 20, "hash_ids": [1, 2], "session_id": "a"},
        {"timestamp": 500, "input_length": 500, "output_length": 10, "hash_ids": [7]},
        {"input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3], "session_id": "a", "delay": 250},
        {
            "request_id": "r4",
            "input_length": 100,
            "output_length": 0,
            "hash_ids": [9],
            "wait_for": ["line-2", "line-3"],
            "delay": 100,
            "tool_wait_ms": 900,
        },
    )
    trace = read_trace(lines, ServiceRates(prefill_tokens_per_s=1000.0, decode_tokens_per_s=10.0))
    times = [(r.request_id, r.lookup_s, r.first_token_s, r.finished_s) for r in trace.requests]
    assert times == [
        ("line-1", 0.0, 1.0, 3.0),  # 1000 tokens at 1000/s, 20 at 10/s
        ("line-2", 0.5, 1.0, 2.0),
        ("line-3", 3.25, 4.75, 5.75),  # the session's previous finished at 3.0, then 250 ms
        ("r4", 6.75, 6.85, 6.85),  # the later of the two it waits for finished at 5.75, then 100 + 900 ms
    ]
    assert trace.modeled == 4 and trace.recorded == 0
    assert trace_plan(trace, 512).requests[2].chain == (1, 2, 3)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("not json", "line 1: not JSON"),
        ('{"input_length": "x", "hash_ids": []}', "line 1: Expected `int`, got `str` - at `$.input_length`"),
        ('{"input_length": 10, "hash_ids": [-1], "timestamp": 0}', "never negative"),
        ('{"input_length": 10, "hash_ids": [1]}', "line 1: the row has no timestamp"),
        ('{"input_length": 10, "hash_ids": [1], "wait_for": ["x"]}', "waits for 'x', which no line before it is"),
    ],
)
def test_a_row_that_cannot_be_replayed_is_refused_with_its_line(line, said):
    with pytest.raises(TraceError, match=said.replace("(", r"\(").replace("[", r"\[").replace("$", r"\$")):
        read_trace([line], ServiceRates(1000.0, 10.0))


def test_a_trace_without_times_and_without_rates_is_refused():
    with pytest.raises(TraceError, match="--prefill-tokens-per-s"):
        read_trace(_lines({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}))


def test_kvobs_whatif_trace_prints_the_table_the_store_gives(vllm_run, tmp_path, capsys):
    """The commands a user runs: `kvobs export mooncake`, then `kvobs whatif --trace` at the block size it printed;
    each size's row is the store's own what-if row, word for word."""
    from kvobs.cli import main

    out = tmp_path / "trace.jsonl"
    assert main(["export", "mooncake", "--store", vllm_run.url, "-o", str(out)]) == 0
    block_size = mooncake_rows(vllm_run.store).block_size
    capsys.readouterr()
    sizes = "40,80"
    assert main(["whatif", "--store", vllm_run.url, "--num-blocks", sizes]) == 0
    table = capsys.readouterr().out.split("Time to first token:")[0]  # (the table, not the time it saves)
    stored = [line for line in table.splitlines() if line.startswith("| lru |")]
    flags = ["whatif", "--trace", str(out), "--block-size", str(block_size), "--num-blocks", sizes]
    assert main(flags) == 0
    printed = capsys.readouterr().out
    assert [line for line in printed.splitlines() if line.startswith("| lru |")] == stored and len(stored) == 2
    assert "timed as kvobs recorded them" in printed and "| observed |" not in printed

    assert main(flags[:3] + flags[5:]) == 2  # no --block-size
    assert "--trace needs --block-size" in capsys.readouterr().err
    bare = tmp_path / "bare.jsonl"
    bare.write_text('{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]}\n')
    assert main(["whatif", "--trace", str(bare), "--block-size", "16", "--num-blocks", "8"]) == 2
    assert "line 1: the row says when its request arrived, not how long it ran" in capsys.readouterr().err
    rates = ["--prefill-tokens-per-s", "1000", "--decode-tokens-per-s", "20"]
    assert main(["whatif", "--trace", str(bare), "--block-size", "16", "--num-blocks", "8", *rates]) == 0
    assert "1 modeled: each prompt prefilled at 1,000 tokens/s" in capsys.readouterr().out
    # flags that do nothing where they are given are refused, each naming what it needs
    assert main(["whatif", "--trace", str(bare), "--block-size", "16", *rates]) == 2
    assert "--trace needs --num-blocks" in capsys.readouterr().err
    assert main(["whatif", "--store", vllm_run.url, "--num-blocks", "8", *rates]) == 2
    assert "give them with --trace" in capsys.readouterr().err
