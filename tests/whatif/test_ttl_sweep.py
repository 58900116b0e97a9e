"""`kvobs whatif --policy session_ttl --ttl 0,60,...`: the hit rate against the TTL at each size, and where a longer pin
stops paying (the knee), worked by hand first, then on the recorded vLLM run."""

from __future__ import annotations

import pytest

from instrumented_engine.whatif.runs import replay_plans, simulate_runs
from instrumented_engine.whatif.ttl_knee import knee, knee_words


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # gain 0.105 from 0 s; 90% of it is 0.0945: 60 s has 0.07, 300 s has 0.10
        ([(0, 0.40), (60, 0.47), (300, 0.50), (3600, 0.505)], 300),
        # the best is not the longest: the gain is to the best (0.10), so 60 s has all of it
        ([(0, 0.40), (60, 0.50), (300, 0.45)], 60),
        ([(300, 0.50), (0, 0.40), (60, 0.491)], 60),  # (in any order; 0.091 >= 0.09)
        ([(0, 0.40), (60, 0.40), (300, 0.39)], None),  # no TTL gains anything
        ([(0, 0.40), (60, 0.50)], None),  # two points have no bend
        ([(0, 0.40), (60, None), (300, 0.50)], None),  # a TTL where nothing was asked is not a point
    ],
)
def test_the_knee_is_the_shortest_ttl_with_nine_tenths_of_the_gain(points, expected):
    assert knee(points) == expected


def test_the_knee_is_said_with_what_it_was_read_from():
    assert knee_words(64, [(0, 0.40), (60, 0.47), (300, 0.50), (3600, 0.505)]) == (
        "64 blocks: knee at 300 s, the shortest TTL with 90% of the gain from 0 s (40.0%) to the best, 3600 s (50.5%)"
    )
    assert (
        knee_words(64, [(0, 0.4), (60, 0.4), (300, 0.4)])
        == "64 blocks: no TTL gains anything over 0 s (hit rate 40.0%)"
    )
    assert "too few to mark a knee" in knee_words(64, [(0, 0.4), (60, 0.5)])


def test_kvobs_whatif_sweeps_the_ttl_at_each_size(vllm_run, capsys):
    from kvobs.cli import main

    flags = ["whatif", "--store", vllm_run.url, "--num-blocks", "24,48", "--policy", "session_ttl"]
    assert main([*flags, "--ttl", "300,0,30"]) == 0
    printed = capsys.readouterr().out
    table = printed.split("Time to first token:")[0]  # (the table, not the time each row saves)
    rows = [line for line in table.splitlines() if line.startswith("| session_ttl")]
    assert [row.split(" | ")[0:2] for row in rows] == [
        ["| session_ttl 0 s", "24"],
        ["| session_ttl 30 s", "24"],
        ["| session_ttl 300 s", "24"],
        ["| session_ttl 0 s", "48"],
        ["| session_ttl 30 s", "48"],
        ["| session_ttl 300 s", "48"],
    ]
    plans = replay_plans(vllm_run.store)
    for n in (24, 48):  # each row is that TTL's own replay, and the knee is read from those rows
        points = [
            (t, simulate_runs(plans, num_blocks=n, policy="session_ttl", ttl_s=t)[0].hit_rate) for t in (0, 30, 300)
        ]
        row = next(r for r in rows if r.startswith("| session_ttl 30 s") and r.split(" | ")[1] == str(n))
        assert row.split(" | ")[2] == f"{points[1][1]:.1%}"
        assert f"- {knee_words(n, points)}" in printed
    assert "Hit rate against the TTL:" in printed

    assert main(["whatif", "--store", vllm_run.url, "--num-blocks", "24", "--ttl", "0,30"]) == 2  # lru: no TTL
    assert "give --policy session_ttl" in capsys.readouterr().err
