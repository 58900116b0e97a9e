"""Alert rules: load-time validation, evaluation on real runs, deduplication, resolution, and the webhook sink
against a real HTTP server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest.mock import patch

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvobs.alerts import signals
from kvobs.alerts.evaluator import Evaluator
from kvobs.alerts.rules import RuleError, builtin_rules, load_rules, parse_rules
from kvobs.alerts.sinks import WebhookSink
from kvobs.analytics.cache.routing import fleet_losses, routing_summary
from kvobs.analytics.windows import lookup_range_sums
from tests.collectors.recorded import scrapes
from tests.stores import copy_store


def test_builtin_rules_cover_the_issue():
    signals = {r.signal for r in builtin_rules()}
    assert signals == {
        "kv_usage",
        "preemptions_per_min",
        "hit_rate",
        "median_block_lifetime_s",
        "prefix_lost_in_pause_per_min",
        "routing_loss_share",
        "step_failure_rate",
        "cache_cost_share",
        "ttft_slo_burn",
        "instance_up",
    }


def test_the_routing_loss_signal_is_the_overviews_share_per_replica(fleet_run, vllm_run):
    """`routing_loss_share` (FleetRoutingLoss) per instance is the routing summary's share over the window, only
    where enough requests were compared; a single instance has nothing to compare with."""
    store = fleet_run.store
    first, last = store.reads.time_range()
    values = {inst: v for inst, _, v in signals.routing_loss_share(store, first, last - 1.0, min_requests=1)}
    losses, _ = fleet_losses(store, store.reads.requests(first, last - 1.0), store.reads.steps(), first, last - 1.0)
    summary = routing_summary(losses, first, last - 1.0).set_index("instance")
    assert values and values == {name: summary.loc[name, "routed_share"] for name in values}
    assert max(values.values()) > 0
    assert signals.routing_loss_share(store, first, last - 1.0, min_requests=10_000) == []
    first, last = vllm_run.store.reads.time_range()
    assert signals.routing_loss_share(vllm_run.store, first, last) == []


def test_the_routing_loss_signal_reads_what_the_collector_measured(fleet_run, tmp_path):
    """Where a collector measured the lookups, the signal reads their rollup (no replay: the same cost whatever the
    window): each request it measured lost what the replay of the whole range says it lost, and the signal is their
    share. (The meter measures as it goes: a replica's requests before it is known to share hashes with another are
    not compared, where the replay, in hindsight, compares them; so the two cover different requests.)"""
    from kvobs.analytics.cache.routing import fleet_losses
    from tests.runs import measured_copy

    first, last = fleet_run.store.reads.time_range()
    store = measured_copy(fleet_run, tmp_path)
    assert not lookup_range_sums(store, first, last).empty
    with patch.object(signals, "fleet_losses", side_effect=AssertionError("replayed")):
        measured = signals.routing_loss_share(store, first, last, min_requests=1)
    rows = store.reads.request_lookups(first, last)
    rows = rows[rows["replicas_compared"] > 0]
    replayed, _ = fleet_losses(store, store.reads.requests(first, last), store.reads.steps(first, last), first, last)
    routed = replayed.set_index("request_id")["routed_tokens"]
    for row in rows.itertuples():
        assert row.routed_blocks * row.block_size == routed[row.request_id], row.request_id
    sums = rows.assign(routed=rows["routed_blocks"] * rows["block_size"]).groupby("instance")
    expected = {
        name: s["routed"] / s["prompt_tokens"] for name, s in sums[["routed", "prompt_tokens"]].sum().iterrows()
    }
    assert measured and {name: share for name, _, share in measured} == pytest.approx(expected)
    assert any(share > 0 for _, _, share in measured)


RULE = "rules: [{{name: {name}, signal: kv_usage, op: '>', threshold: 1, severity: info, {extra}}}]"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("rules: [{name: A, signal: kv_usage, op: '>', severity: warning}]", "rule 'A': field 'threshold' is required"),
        ("rules: [{name: B, signal: nope, op: '>', threshold: 1, severity: warning}]", "rule 'B': field 'signal'"),
        ("rules: [{name: C, signal: kv_usage, op: '=>', threshold: 1, severity: warning}]", "rule 'C': field 'op'"),
        (RULE.format(name="D", extra="threshold: high").replace("threshold: 1, ", ""), "rule 'D': field 'threshold'"),
        ("rules: [{name: E, signal: kv_usage, op: '>', threshold: 1, severity: loud}]", "rule 'E': field 'severity'"),
        (
            "rules: [{name: F, signal: kv_usage, op: '>', threshold: 1, severity: info, for: soon}]",
            "rule 'F': field 'for'",
        ),
        (RULE.format(name="G", extra="params: {x: 1}"), "rule 'G': field 'params'"),
        (RULE.format(name="H", extra="colour: red"), "rule 'H': unknown field 'colour'"),
        ("rules: [{signal: kv_usage}]", "rule #1: field 'name' is required"),
        ("rules: {name: I}", "expected a mapping with a 'rules' list"),
        ("rules: [", "not valid YAML"),
    ],
)
def test_malformed_rules_fail_at_load_naming_rule_and_field(body, message):
    with pytest.raises(RuleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rules(body)


def test_rule_file_overrides_builtin_by_name(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  - {name: KVCachePreemptionStorm, signal: preemptions_per_min, op: '>=', threshold: 1,"
        " severity: critical, window: 1h}\n"
    )
    rules = {r.name: r for r in load_rules(path)}
    assert rules["KVCachePreemptionStorm"].threshold == 1 and rules["KVCachePreemptionStorm"].window_s == 3600
    assert len(rules) == len(builtin_rules())
    assert [r.name for r in load_rules(path, include_builtin=False)] == ["KVCachePreemptionStorm"]


class Hook(BaseHTTPRequestHandler):
    received: list = []
    fail_first = 0

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Hook.fail_first > 0:
            Hook.fail_first -= 1
            self.send_response(503)
        else:
            Hook.received.append(body)
            self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    Hook.received, Hook.fail_first = [], 1  # the first POST fails: the sink must retry
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hook"
    server.shutdown()


def test_agent_run_fires_what_happened_once_then_resolves(agent_run, webhook, tmp_path):
    from kvobs.store import open_store

    end = agent_run.store.reads.time_range()[1]
    store = open_store(f"sqlite:///{tmp_path / 'copy.db'}")  # alerts go to a copy: the shared run stays as it was
    copy_store(agent_run.store, store)
    first = store.reads.time_range()[0]
    window = end - first + 1
    # The built-in rules with a window covering the whole 30 s run and no `for` (the run is shorter than theirs).
    zero = ("SessionPrefixLostInToolPause", "AgentStepFailureRate")
    rules = [
        replace(r, window_s=window, for_s=0.0, threshold=0.0 if r.name in zero else r.threshold)
        for r in builtin_rules()
        if r.name
        in ("SessionPrefixLostInToolPause", "AgentStepFailureRate", "KVCacheEvictionChurn", "CollectorTargetDown")
    ]
    sink = WebhookSink(webhook, backoff_s=0.01)
    evaluator = Evaluator(store, rules, sinks=[sink])
    fired = evaluator.evaluate(end)
    by_rule = {}
    for t in fired:
        by_rule.setdefault(t["rule"], []).append(t)
    not_model = agent_run.result.num_failed - agent_run.result.failed["invalid_response"]  # model output errors
    assert agent_run.result.failed["invalid_response"] > 0  # ... happened, and are not counted as failures here
    assert by_rule["AgentStepFailureRate"][0]["value"] == pytest.approx(not_model / agent_run.result.steps)
    lost = store.reads.session_footprints()["session_evicted_idle_blocks"].fillna(0).sum()
    assert lost > 0  # settled pause losses: sessions came back after losing blocks
    (prefix,) = by_rule["SessionPrefixLostInToolPause"]  # one instance: a rate, per instance, not a session each
    assert prefix["instance"] == "engine-test" and prefix["session_id"] is None
    assert prefix["value"] == pytest.approx(lost * 60 / window)
    assert "CollectorTargetDown" not in by_rule  # our engine is not scraped here: no `up` samples, nothing fires
    assert evaluator.evaluate(end) == []  # deduplicated: still firing, nothing new
    assert len(store.reads.alerts()) == len(fired)
    later = evaluator.evaluate(end + 3600)  # an hour on, no data: everything resolves
    assert {t["state"] for t in later} == {"resolved"} and len(later) == len(fired)
    assert [p["status"] for p in Hook.received] == ["firing", "resolved"] and sink.num_failed == 0
    assert Hook.received[0]["alerts"][0]["labels"]["alertname"] in by_rule


def test_vllm_run_preemption_storm_and_instance_up(vllm_run, tmp_path):
    from kvobs.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    copy_store(vllm_run.store, store)
    first, last = store.reads.time_range()
    rules = parse_rules(
        "rules:\n  - {name: Storm, signal: preemptions_per_min, op: '>', threshold: 0,"
        f" severity: warning, window: {last - first + 1}}}\n"
        "  - {name: Down, signal: instance_up, op: '<', threshold: 1, severity: critical}\n"
    )
    fired = Evaluator(store, rules).evaluate(last)
    assert [t["rule"] for t in fired] == ["Storm"]  # 5 preemptions recorded (the fixture README); every scrape answered
    assert fired[0]["value"] == pytest.approx(5 * 60 / (last - first + 1), rel=0.01)


def test_cli_bad_rules_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rules: [{name: X, signal: kv_usage, op: '>', threshold: 1, severity: loud}]\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvobs.cli",
            "alerts",
            "--rules",
            str(path),
            "--store",
            f"sqlite:///{tmp_path / 's.db'}",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "rule 'X': field 'severity'" in done.stderr and "Traceback" not in done.stderr


def test_vllm_run_pause_loss_alert_counts_pauses_not_losses_after_a_sessions_end(vllm_run, tmp_path):
    from kvobs.store import open_store
    from tests.collectors import expected

    store = open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    copy_store(vllm_run.store, store)
    first, last = store.reads.time_range()
    window = last - first + 1
    rules = parse_rules(
        "rules:\n  - {name: Pause, signal: prefix_lost_in_pause_per_min, op: '>', threshold: 0,"
        f" severity: warning, window: {window}}}\n"
    )
    outcome = expected.kv_outcome()
    assert sum(outcome["after_end"].values()) > 0  # sessions that had ended lost blocks too
    (fired,) = Evaluator(store, rules).evaluate(last)
    assert fired["value"] == pytest.approx(sum(outcome["pause"].values()) * 60 / window)  # only the pauses


def test_cli_tells_each_transition_once(vllm_run, tmp_path):
    from kvobs.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'copy.db'}")
    copy_store(vllm_run.store, store)
    first, last = store.reads.time_range()
    store.close()
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - {name: Storm, signal: preemptions_per_min, op: '>', threshold: 0, severity: warning,"
        f" window: {last - first + 1}}}\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvobs.cli",
            "alerts",
            "--store",
            f"sqlite:///{tmp_path / 'copy.db'}",
            "--rules",
            str(rules),
            "--no-builtin",
            "--at",
            str(last),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    told = [line for line in (done.stdout + done.stderr).splitlines() if "Storm" in line]
    # one transition line (not a log line and a table line), then what fires now
    assert len(told) == 2 and told[0].startswith("firing ") and told[1] == "firing now: Storm (vllm-cpu)"


def _recorded_counter(body: str, name: str) -> float:
    """A counter's cumulative value in a recorded /metrics body, read by prometheus_client's own parser."""
    return sum(s.value for f in text_string_to_metric_families(body) for s in f.samples if s.name == name)


def test_the_hit_rate_rule_counts_the_windows_tokens(agent_run, vllm_run):
    """The collapse rule's value is the hit rate of the requests that arrived in its window: on our engine, their
    cached / prompt tokens (its snapshots carry the run's cumulative rate, which a collapse barely moves); on vLLM,
    its recorded counters' increase over the window's scrapes."""
    first, last = agent_run.store.reads.time_range()
    since = first + (last - first) / 2
    reqs = agent_run.store.reads.requests(since, last)
    assert len(reqs) > 0
    ((instance, _, value),) = signals.hit_rate(agent_run.store, since, last)
    assert instance == "engine-test" and value == pytest.approx(
        reqs["cached_tokens"].sum() / reqs["prompt_tokens"].sum()
    )

    recorded = scrapes()
    half = len(recorded) // 2
    before, end = recorded[half - 1][1], recorded[-1][1]
    names = [f"vllm:prefix_cache_{c}_total" for c in ("hits", "queries")]
    hits, asked = (_recorded_counter(end, name) - _recorded_counter(before, name) for name in names)
    assert asked > 0
    ((instance, _, value),) = signals.hit_rate(vllm_run.store, recorded[half][0], recorded[-1][0])
    assert instance == "vllm-cpu" and value == pytest.approx(hits / asked)


def test_the_pause_loss_signal_counts_each_sessions_increase_inside_the_window(tmp_path):
    """Worked by hand: a session's loss in the window is its highest count in it less its latest count before it (0
    with none); a session with no row in the window, or whose count did not rise, adds nothing; rows after the window's
    end are not read."""
    from kvobs.store import open_store
    from kvobs.store.rows import SnapshotRecord

    store = open_store(f"sqlite:///{tmp_path / 'pauses.db'}")
    counts = [  # (session, instance, ts, blocks lost while idle so far)
        ("s1", "e0", 10.0, 2),
        ("s1", "e0", 50.0, 5),
        ("s1", "e0", 120.0, 9),  # 9 - 5 = 4
        ("s1", "e0", 200.0, 30),  # after the window
        ("s2", "e0", 110.0, 3),  # none before: 3
        ("s3", "e1", 20.0, 7),
        ("s3", "e1", 130.0, 7),  # no rise
        ("s4", "e1", 30.0, 1),  # nothing in the window
        ("s5", "e1", 150.0, 6),  # 6
        ("s5", "e1", 155.0, 4),  # its highest in the window counts
    ]
    store.write(
        [
            (
                "insert",
                [
                    SnapshotRecord(ts=ts, instance=inst, session_id=s, session_evicted_idle_blocks=n, kv_usage=0.5)
                    for s, inst, ts, n in counts
                ],
            )
        ]
    )
    assert signals.prefix_lost_in_pause_per_min(store, 100.0, 160.0) == [("e0", None, 7.0), ("e1", None, 6.0)]
    assert signals.prefix_lost_in_pause_per_min(store, 0.0, 60.0) == [("e0", None, 5.0), ("e1", None, 8.0)]
    assert signals.prefix_lost_in_pause_per_min(store, 300.0, 360.0) == []
