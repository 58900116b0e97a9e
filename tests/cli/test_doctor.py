"""`kvobs doctor`: a replica's KV events against its own counters (the store), and the collector's view of each
stream (its /metrics): on the recorded vLLM run they agree; a hit counter that over-counts and a stream that lost
batches are each named, with the side that is off; the wire shapes and lag come from a real collector."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import msgspec
from sqlalchemy import delete
from sqlalchemy.engine import make_url

from collectors.collector import Collector, CollectorOptions
from kvobs.analytics.cache.agreement import kv_counter_agreement
from kvobs.store import StoreWriter, open_store
from kvobs.store.rows import MetricSampleRecord
from kvobs.store.schema import KVEventRow
from kvobs.vllm import kv_events as wire
from tests.collectors.replay import publisher, wait_subscribed
from tests.dashboard.test_app import step_page_text
from tests.server.conftest import free_port
from tests.waiting import wait_for

DOCTOR = [sys.executable, "-m", "kvobs.cli", "doctor"]


def _copy(run, tmp_path):
    copy = tmp_path / "copy.db"
    source = sqlite3.connect(make_url(run.url).database)
    source.backup(target := sqlite3.connect(copy))
    target.close()
    source.close()
    return f"sqlite:///{copy}"


def test_the_recorded_vllm_runs_events_and_counters_agree(vllm_run):
    (check,) = kv_counter_agreement(vllm_run.store)
    # 205 blocks x 128 stored; 38,827 - 17,280 prompt tokens missed + 8,048 generated; 57 requests' partial blocks
    assert (check.verdict, check.stored_tokens, check.counted_tokens, check.slack_tokens) == (
        "agree",
        26_240,
        29_595,
        7_296,
    )
    done = subprocess.run([*DOCTOR, "--store", vllm_run.url], capture_output=True, text=True)
    assert done.returncode == 0 and "ok vllm-cpu: agree" in done.stdout and "every check passed" in done.stdout


def test_an_engine_written_store_is_checked_from_its_own_request_rows(agent_run, tmp_path):
    """`kvobs serve --store` writes its KV events and requests itself, and nothing scrapes its /metrics: the doctor
    checks its stored blocks against its own request rows (they say what was cached) and passes; a stream short of
    blocks is still named."""
    done = subprocess.run([*DOCTOR, "--store", agent_run.url], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    assert "ok engine-test: agree:" in done.stdout and "its own request rows (no scrape needed)" in done.stdout
    url = _copy(agent_run, tmp_path)
    store = open_store(url)
    with store.session() as session, session.begin():  # the stream lost half of its stored blocks
        stored = [r.id for r in session.query(KVEventRow).filter(KVEventRow.kind == "stored").all()]
        session.execute(delete(KVEventRow).where(KVEventRow.id.in_(stored[: len(stored) // 2])))
    store.close()
    done = subprocess.run([*DOCTOR, "--store", url], capture_output=True, text=True)
    assert done.returncode == 1 and "! engine-test: events_short" in done.stdout


def test_an_over_counting_hit_counter_and_a_short_stream_are_named(vllm_run, tmp_path):
    url = _copy(vllm_run, tmp_path)
    store = open_store(url)
    first, last = store.reads.time_range()
    writer = StoreWriter(store)  # the hit counter says 4,000 more tokens were found than were: vLLM's bug
    writer.add(MetricSampleRecord(ts=last, instance="vllm-cpu", name="vllm:prefix_cache_hits:increase", value=4000.0))
    writer.close()
    (check,) = kv_counter_agreement(store)
    assert check.verdict == "counters_off" and "hit counter over-counts" in check.words
    with store.session() as session, session.begin():  # a stream that lost a third of its stored blocks
        stored = [r.id for r in session.query(KVEventRow).filter(KVEventRow.kind == "stored").all()]
        session.execute(delete(KVEventRow).where(KVEventRow.id.in_(stored[: len(stored) // 3])))
    (check,) = kv_counter_agreement(store)
    assert check.verdict == "events_short" and "trust the counters' hit rate" in check.words
    store.close()
    done = subprocess.run([*DOCTOR, "--store", url], capture_output=True, text=True)
    assert done.returncode == 1 and "! vllm-cpu: events_short" in done.stdout and "1 problem(s)" in done.stdout


def _collector(tmp_path):
    """(store, collector, KV-event port, metrics port): a collector of one replica, `vllm-a`, with its /metrics."""
    port, metrics = free_port(), free_port()
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    options = CollectorOptions(
        kv_events=[f"vllm-a=tcp://127.0.0.1:{port}"], kv_events_bind=True, metrics_address=f"127.0.0.1:{metrics}"
    )
    return store, Collector(options, store=store), port, metrics


def _doctor(store, metrics: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DOCTOR, "--store", store.url, "--collector", f"http://127.0.0.1:{metrics}/metrics"],
        capture_output=True,
        text=True,
    )


def test_the_collectors_view_names_each_streams_wire_shape_and_lag(tmp_path):
    """A real collector hears one replica send an array batch and a map batch: doctor reads both shapes, the
    latest batch's lag, and no loss, from the collector's /metrics."""
    store, collector, port, metrics = _collector(tmp_path)
    collector.start()
    try:
        with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
            wait_subscribed(pub)
            stored = wire.BlockStored([1], None, [5] * 16, 16, None, "GPU", None)
            batch = wire.KVEventBatch(time.time(), [stored], None)
            pub.send_multipart([b"", wire.seq_bytes(0), wire.encode_batch(batch)])
            as_map = {"ts": batch.ts, "events": [stored], "data_parallel_rank": None}
            pub.send_multipart([b"", wire.seq_bytes(1), msgspec.msgpack.encode(as_map)])
            wait_for(lambda: collector.streams[0].subscriber.num_batches == 2)
        done = _doctor(store, metrics)
    finally:
        collector.stop()
    assert "ok vllm-a: wire: array batch, map events and map batch, map events; latest batch" in done.stdout, (
        done.stdout + done.stderr
    )
    unreachable = subprocess.run(
        [*DOCTOR, "--store", store.url, "--collector", f"http://127.0.0.1:{free_port()}/metrics"],
        capture_output=True,
        text=True,
    )
    assert unreachable.returncode == 2 and "cannot read the collector's metrics" in unreachable.stderr


def test_a_collector_that_lost_a_replicas_lease_is_named(tmp_path):
    """A real collector whose lease on `vllm-a` another writer took (it stalled past its expiry) drops the batches it
    still hears; doctor reads that from its /metrics: the replica is a problem, named with why, and the dropped
    batches are counted."""
    from kvobs.store.leases import LeaseKeeper

    store, collector, port, metrics = _collector(tmp_path)
    other = LeaseKeeper(store.leases, ["vllm-a"], role="collect")
    collector.start()
    try:
        t = time.time() + 120
        other.leases.claim(other.instances, other.holder, ttl_s=600.0, now=t)
        collector.leases.renew(t + 1)
        with publisher(f"tcp://127.0.0.1:{port}", bind=False) as pub:
            wait_subscribed(pub)
            stored = wire.BlockStored([1], None, [5] * 16, 16, None, "GPU", None)
            pub.send_multipart([b"", wire.seq_bytes(0), wire.encode_batch(wire.KVEventBatch(time.time(), [stored]))])
            wait_for(lambda: collector.streams[0].subscriber.num_batches == 1)
        done = _doctor(store, metrics)
    finally:
        collector.stop()
    assert done.returncode == 1, done.stdout + done.stderr
    assert "! vllm-a: wire: array batch, map events; latest batch" in done.stdout
    assert "its lease was taken by another writer 1 time(s): this collector dropped its data meanwhile" in done.stdout
    assert "! (collector): 1 kv_events item(s) dropped" in done.stdout


def test_steps_of_a_convention_tied_to_no_server_request_are_named_with_the_fix(tmp_path):
    """The recorded OpenInference run replayed without the server's request spans (a vLLM started without
    --otlp-traces-endpoint): no step can be tied to its request, and the doctor says so and what to pass; with them,
    every answered step is."""
    from tests.collectors.test_agent_fixtures import _is_server, exports, replay

    bodies = exports("openinference-openai")
    said = {}
    for name, wanted in (("without", [b for b in bodies if not _is_server(b)]), ("with", bodies)):
        url = f"sqlite:///{tmp_path}/{name}.db"
        replay(open_store(url), wanted)
        said[name] = subprocess.run([*DOCTOR, "--store", url], capture_output=True, text=True).stdout
    assert (
        "! openinference: 0 of 9 steps tied to their server request; most of the others: no server request span "
        "arrived for the call's time window. Fix: export the server's request spans to the collector (vLLM: "
        "--otlp-traces-endpoint" in said["without"]
    ), said["without"]
    assert (
        "ok openinference: 8 of 9 steps tied to their server request; most of the others: the call failed without "
        "an answer" in said["with"]
    ), said["with"]


def test_a_stream_is_short_only_by_a_whole_block_under_the_band(vllm_run, tmp_path):
    """Events are lost a block at a time: tokens under the band by less than a block are the engines' own accounting
    (the block recomputed at a whole-prompt hit), not a lost event; a block's worth under it is."""
    url = _copy(vllm_run, tmp_path)
    store = open_store(url)
    (check,) = kv_counter_agreement(store)
    band_low = check.counted_tokens - check.slack_tokens  # 35,999 tokens: stored 40,064, 128 a block
    keep_above = (check.stored_tokens - band_low) // 128  # blocks that can go while the stream stays in the band
    stored = [r.id for r in store.session().query(KVEventRow).filter(KVEventRow.kind == "stored").all()]
    for gone, verdict in ((keep_above + 1, "agree"), (keep_above + 2, "events_short")):
        with store.session() as session, session.begin():
            session.execute(delete(KVEventRow).where(KVEventRow.id.in_(stored[:gone])))
        (check,) = kv_counter_agreement(store)
        under = band_low - check.stored_tokens
        assert check.verdict == verdict and (0 < under < 128 if verdict == "agree" else under >= 128), (under, check)
    store.close()


def test_requests_never_scheduled_looked_nothing_up_and_the_doctor_passes(overload):
    """Two steps timed out in the queue (the scripted overload run: its truth is exact), so their requests were
    aborted before any lookup: the engine stores their cached tokens as unknown (not 0, which would read as two
    misses), the doctor's check of the engine's own rows passes (it once said `events_short` on a demo under load),
    and the replay leaves them out and counts them."""
    from instrumented_engine.whatif.replay import ReplayPlan

    _, store = overload
    reqs = store.reads.requests().set_index("request_id")
    never = reqs.loc[["q1-1", "q2-1"]]
    assert (never["finish_reason"] == "abort").all() and never["cached_tokens"].isna().all()
    assert reqs.drop(index=never.index)["cached_tokens"].notna().all()  # every admitted request said its own
    (check,) = kv_counter_agreement(store)
    assert check.verdict == "agree", check.words
    plan = ReplayPlan.from_store(store)
    assert plan.never_admitted == 2 and not {"q1-1", "q2-1"} & {r.request_id for r in plan.requests}
    assert plan.skipped == 0 and plan.num_requests == len(reqs) - 2


def test_replies_without_prompt_token_details_are_named_with_their_fix(
    smollm2_source, agent_run, tmp_path, monkeypatch
):
    """`kvobs serve --no-prompt-tokens-details` answers as vLLM does by default: usage without its cached tokens. The
    SDK's steps then know none, and the doctor names the setting, with the flag that fixes it; on a server that sends
    them (the agent run) every answered step says what was cached."""
    from kvobs.analytics.cache.token_details import FIX
    from tests.runs import sdk_workload
    from tests.server.conftest import running_server

    url = f"sqlite:///{tmp_path / 'details-off.db'}"
    options = {"store_url": url, "instance": "details-off", "prompt_tokens_details": False}
    with running_server(smollm2_source, options=options, num_blocks=64, max_model_len=448) as server:
        sdk_workload(server, open_store(url), sessions=2, concurrency=2, steps=2)
    steps = open_store(url).reads.steps()
    assert steps["prompt_tokens"].notna().all() and steps["cached_tokens"].isna().all()  # truth: replies say none
    requests = open_store(url).reads.requests()
    assert (requests["cached_tokens"] > 0).any()  # while the server's own record shows hits
    done = subprocess.run([*DOCTOR, "--store", url], capture_output=True, text=True)
    assert done.returncode == 1, done.stdout
    assert f"! {len(steps)} of {len(steps)} answered steps' replies carried no cached tokens" in done.stdout
    assert FIX in done.stdout
    words = step_page_text(monkeypatch, url, steps["session_id"].iloc[0], int(steps["step_index"].iloc[0]))
    assert "A miss that is not the cache's: its reply gave its prompt tokens but no cached tokens" in words
    good = subprocess.run([*DOCTOR, "--store", agent_run.url], capture_output=True, text=True)
    assert "answered steps' replies said how many prompt tokens were cached" in good.stdout, good.stdout


def test_a_prompt_that_changes_at_its_start_is_named_not_blamed_on_the_cache(changing_start_run, monkeypatch):
    """Two conversations on a real server with room for both (`tests.runs.changing_start_run`): one whose system
    prompt opens with the time of each call, one without. The stamped one hits only its first block on every later
    turn though each earlier turn is still cached, and the doctor names it, with the fix; the other reuses its prefix
    every turn and is not named."""
    from kvobs.analytics.cache.prompt_starts import FIX, changing_starts

    url, store = changing_start_run.url, changing_start_run.store
    reqs = store.reads.requests().sort_values("arrival_ts").set_index("session_id")
    stamped, steady = reqs.loc["stamped"], reqs.loc["steady"]
    # truth: every later stamped turn hit only the block before the time's first changing digit, the steady ones
    # the whole conversation before them
    assert (stamped["cached_tokens"].iloc[1:] == 16).all()
    assert (steady["cached_tokens"].iloc[1:] >= steady["prompt_tokens"].shift().iloc[1:] - 16).all()
    assert not len(store.reads.kv_events(kinds=["removed", "evicted"]))  # nothing left the cache: not its size
    (found,) = changing_starts(store, None, None)
    assert (found.session_id, found.requests, found.parted, found.block) == ("stamped", 4, 3, 1)
    done = subprocess.run([*DOCTOR, "--store", url], capture_output=True, text=True)
    assert done.returncode == 1 and f"! {found.words}" in done.stdout and FIX in done.stdout, done.stdout
    assert "session steady" not in done.stdout
    # the step story names it too, on a later step of that session, never on the other's
    assert f"A miss that is not the cache's: {found.words}" in step_page_text(monkeypatch, url, "stamped", 2)
    assert "A miss that is not the cache's" not in step_page_text(monkeypatch, url, "steady", 2)


def test_requests_left_without_cached_tokens_are_named_with_the_fix_only_where_none_could_be_filled():
    """The collector's `kvobs_collector_requests_cached_filled_total{outcome}` as prometheus_client writes it: where
    some requests took their reply's count, the others' unknown counts are said without an alarm (an instrumentation
    may keep none); where none could and the replies had none, the server's flag is named."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from kvobs.commands.doctor import exposition_checks
    from kvobs.semconv.metrics import LABEL_OUTCOME, kvobs_metrics

    def checked(**outcomes) -> tuple[bool, str]:
        registry = CollectorRegistry()
        spec = kvobs_metrics.COLLECTOR_REQUESTS_CACHED_FILLED
        counter = Counter(spec.name, spec.description, [LABEL_OUTCOME], registry=registry)
        for outcome, n in outcomes.items():
            counter.labels(outcome).inc(n)
        checks = {name: (ok, said) for name, ok, said in exposition_checks(generate_latest(registry).decode())}
        return checks["(requests' cached tokens from replies)"]

    ok, said = checked(filled=9, no_count=9)  # the recorded LangChain and Agents SDK run on vLLM
    assert ok and "of 18 joined requests whose own span said no cached tokens, 9 took the count" in said
    assert "9 stay unknown (never 0)" in said and "to fix" not in said
    ok, said = checked(no_count=6, counts_differ=1)
    assert not ok and said.endswith(
        "to fix: start vLLM with --enable-prompt-tokens-details (kvobs serve sends "
        "them unless --no-prompt-tokens-details)"
    )
    assert "1 stay unknown: their reply counted other prompt tokens than the request" in said
