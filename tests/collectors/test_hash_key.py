"""Keyed block hashes (`kvobs.hash_key`): the store holds no hash an engine computed, and every analysis gives the
same answers, on the recorded vLLM run, the recorded fleet and our engine's own rows."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pandas as pd
import pytest

from kvobs.analytics.cache import range_tax, shortfall, store_lookups
from kvobs.analytics.steps import step_causes
from kvobs.block_events import Batch, Cleared, Removed, Stored
from kvobs.hash_key import HashKey
from kvobs.store import open_store
from tests.runs import FLEET

SECRET = b"an operator's secret, 32 bytes.."


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("key") / "hash.key"
    path.write_bytes(SECRET + b"\n")
    return str(path)


def test_a_key_keys_equal_hashes_equally_and_refuses_a_short_secret(key_file, tmp_path):
    key = HashKey.from_file(key_file)
    assert key.hash(7) == HashKey(SECRET).hash(7) != HashKey(SECRET[::-1]).hash(7)  # (the newline left out)
    assert key.hash(7) != 7 and key.hash(7) != key.hash(8) and 0 <= key.hash(2**64 - 1) < 2**64
    short = tmp_path / "short.key"
    short.write_bytes(b"guessable")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        HashKey.from_file(short)
    with pytest.raises(ValueError, match="hash key file"):
        HashKey.from_file(tmp_path / "missing.key")
    stored = Stored([1, 2], 9, 16, None, None, "s", extra_keys=['["salt"]', None], first_tokens=[5, 6])
    batch = key.batch(Batch(1.0, [stored, Removed([2], None, None, None), Cleared()]))
    keyed, removed, cleared = batch.events
    assert keyed.hashes == [key.hash(1), key.hash(2)] and keyed.parent == key.hash(9)
    assert keyed.extra_keys == [key.text('["salt"]'), None] and keyed.extra_keys[0] != '["salt"]'
    assert keyed.session_id == "s" and keyed.first_tokens == [5, 6]  # (tokens are read in memory, never stored)
    assert removed.hashes == [key.hash(2)] and isinstance(cleared, Cleared)
    assert stored.hashes == [1, 2]  # the batch given is left as it was


@pytest.fixture(scope="module")
def keyed_run(key_file, tmp_path_factory):
    from tests.collectors.recorded_run import collect_recorded

    url = f"sqlite:///{tmp_path_factory.mktemp('keyed') / 'kvobs.db'}"
    store = open_store(url)
    with collect_recorded(store, hash_key_file=key_file):
        pass
    return url, store


def test_the_keyed_store_holds_every_row_and_no_hash_the_engine_sent(keyed_run, vllm_run, key_file):
    key = HashKey.from_file(key_file)
    plain, keyed = vllm_run.store.reads.kv_events(), keyed_run[1].reads.kv_events()
    assert len(plain) == len(keyed) > 0
    sent = set(plain["block_hash"].dropna().astype("uint64"))
    stored = set(keyed["block_hash"].dropna().astype("uint64"))
    assert len(sent) == len(stored) and not sent & stored
    assert stored == {key.hash(int(h)) for h in sent}
    parents = set(keyed["parent_hash"].dropna().astype("uint64"))
    assert parents and parents <= stored | {key.hash(int(h)) for h in plain["parent_hash"].dropna().astype("uint64")}


def _whatif(url: str) -> str:
    flags = ["--num-blocks", "24,48", "--policy", "session_ttl", "--ttl", "0,30,300", "--tier-blocks", "16"]
    done = subprocess.run(
        [sys.executable, "-m", "kvobs.cli", "whatif", "--store", url, *flags], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_analysis_gives_the_same_answers_keyed(keyed_run, vllm_run):
    url, keyed = keyed_run
    plain = vllm_run.store
    # the what-if (chains, replay, fidelity, time saved, recompute tax, eviction ages, tier sweep): word for word
    assert _whatif(url) == _whatif(vllm_run.url)
    first, last = plain.reads.time_range()
    assert keyed.reads.time_range() == (first, last)

    def split(store):
        reqs, steps = store.reads.requests(first, last), store.reads.steps(first, last)
        lookups, _ = store_lookups(store, reqs, steps, first, last)
        return shortfall(lookups, "instance")

    pd.testing.assert_frame_equal(split(keyed), split(plain))
    pd.testing.assert_frame_equal(range_tax(keyed, None, None), range_tax(plain, None, None))
    pd.testing.assert_frame_equal(keyed.reads.sessions(), plain.reads.sessions())
    causes = [step_causes(store, first, last).drop(columns=["evidence"], errors="ignore") for store in (keyed, plain)]
    pd.testing.assert_frame_equal(*causes)


def test_the_fleets_routing_loss_is_the_same_keyed(key_file, fleet_run, tmp_path):
    from tests.collectors.recorded_run import collect_recorded

    keyed = open_store(f"sqlite:///{tmp_path / 'fleet.db'}")
    with collect_recorded(keyed, replicas=FLEET, hash_key_file=key_file):
        pass
    first, last = fleet_run.store.reads.time_range()

    def routed(store):
        lookups, _ = store_lookups(
            store, store.reads.requests(first, last), store.reads.steps(first, last), first, last
        )
        return lookups.drop(columns=["request_id"]).sort_values("lookup_ts").reset_index(drop=True)

    plain_lookups = routed(fleet_run.store)
    assert plain_lookups["routed_blocks"].sum() > 0
    pd.testing.assert_frame_equal(routed(keyed), plain_lookups)


def test_kvobs_serve_stores_its_own_rows_keyed(smollm2_source, key_file, tmp_path):
    """Our engine writing its rows itself: every hash its block manager computed is stored keyed, and its run
    replays step for step as before (the what-if's check at the observed point)."""
    from instrumented_engine.whatif.fidelity import fidelity
    from instrumented_engine.whatif.runs import observed_total, replay_plans
    from tests.server.conftest import SERVED, running_server

    url = f"sqlite:///{tmp_path / 'served.db'}"
    computed: set[int] = set()

    class Hashes:
        def on_step(self, result) -> None:
            for event in result.events:
                computed.update(getattr(event, "block_hashes", ()) or ())

    options = {"store_url": url, "instance": "eng", "hash_key_file": key_file}
    with running_server(smollm2_source, options=options, num_blocks=12, max_model_len=160) as server:
        server.engine.observers.append(Hashes())
        for session, text in [("a", "Plan a trip."), ("b", "Plan a meal."), ("a", "Plan a trip. And a hotel.")]:
            body = {"model": SERVED, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
            reply = httpx.post(server.url + "/v1/chat/completions", json=body, headers={"X-Session-ID": session})
            assert reply.status_code == 200, reply.text
    store = open_store(url)
    key = HashKey.from_file(key_file)
    stored = set(store.reads.kv_events(kinds=["stored"])["block_hash"].astype("uint64"))
    assert computed and stored == {key.hash(h) for h in computed} and not stored & computed
    plans = replay_plans(store)
    check, _ = fidelity(plans, observed_total(plans, store, None, None)["hit"])
    assert check.reproduces and check.error_points == pytest.approx(0.0)
