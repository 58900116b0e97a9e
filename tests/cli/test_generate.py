"""`kvobs generate` end to end on the real SmolLM2."""

from __future__ import annotations

from kvobs.cli import main


def test_generate_prints_completions_and_kv_event_summary(capsys):
    rc = main(
        [
            "generate",
            "--chat",
            "Say hi.",
            "Say hi.",
            "--max-tokens",
            "4",
            "--num-blocks",
            "64",
            "--max-model-len",
            "256",
            "--session",
            "cli-test",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert out.count("--- 'Say hi.'") == 2 and "finish=" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("KV events: ") and "prefix_lookup=2" in summary and "stored=" in summary


def test_generate_reports_bad_configuration_without_a_traceback(capsys):
    rc = main(["generate", "hello", "--num-blocks", "8", "--max-model-len", "2048"])
    err = capsys.readouterr().err
    assert rc == 2 and "needs 129 (block 0 is reserved)" in err
