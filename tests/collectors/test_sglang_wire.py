"""SGLang's KV events, published by SGLang's own `ZmqEventPublisher` (sglang 0.5.23, from `.venv-sglang`: see
tests/engines/sglang.txt), read by the collector through the same door as vLLM's (`kvobs.vllm.normalize`: SGLang
sends vLLM's framing and tagged-map events, its batch's third field is `attn_dp_rank`): its four tiers under
kvobs's names (`GPU`, `CPU_PINNED` -> `CPU`, `DISK`, `EXTERNAL`), its signed namespaced hashes as the store's
unsigned ones, `cache_salt` ignored, the session it names kept; only the device tier's removals are the session's
losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from collectors.drops import DropCounter
from collectors.kv.ingest import KVIngest
from collectors.kv.subscriber import KVEventSubscriber
from kvobs.store import StoreWriter, open_store
from kvobs.vllm.kv_events import as_uint64
from tests.collectors.agent_harness import ROOT
from tests.server.conftest import free_port
from tests.waiting import wait_for

SGLANG = ROOT / ".venv-sglang"
SESSION = "sgl-session-1"


def _publisher(endpoint: str, replay: str) -> subprocess.Popen:
    if not (SGLANG / "sglang").is_dir():
        pytest.fail(f"SGLang's publisher is not installed in {SGLANG}: run `bash scripts/install.sh` (the test extra)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SGLANG), str(ROOT)])}
    script = str(ROOT / "tests" / "collectors" / "sglang_publisher.py")
    return subprocess.Popen(
        [sys.executable, script, endpoint, replay], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_sglang_s_own_publisher_is_read_through_the_door_tier_by_tier(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer = StoreWriter(store)
    ingest = KVIngest(writer, instance="sglang-a", settle_s=0.0)
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    drops = DropCounter()
    subscriber = KVEventSubscriber(endpoint, ingest.on_batch, drops, bind=True, replay_endpoint=replay, topic="kv")
    subscriber.start()
    publisher = _publisher(endpoint, replay)
    try:
        hashes = json.loads(publisher.stdout.readline())
        wait_for(lambda: subscriber.num_batches == 4, timeout_s=20)
    finally:
        publisher.communicate(timeout=30)  # (closes its input: it shuts down)
        subscriber.stop()
    ingest.snapshot(final=True)
    writer.close()
    assert drops.totals() == {} and subscriber.num_lost == 0 and subscriber.num_events == 7
    assert dict(subscriber.shapes) == {"array batch, map events": 4}  # vLLM's shape: one door for both

    (h1, h2), _ = hashes[0][0], None
    h3, h4 = hashes[1][1][0], hashes[3][0][0]
    assert min(h1, h2, h3, h4) < 0, "SGLang's namespaced hashes are signed: the case the store's unsigned form is for"
    events = store.reads.kv_events()  # (in time order, a batch in its order)
    got = [
        (kind, int(block), medium, session if isinstance(session, str) else None)
        for kind, block, medium, session in zip(
            events["kind"], events["block_hash"], events["medium"], events["session_id"]
        )
        if block is not None and block == block
    ]
    u1, u2, u3, u4 = (as_uint64(h) for h in (h1, h2, h3, h4))
    assert got == [
        ("stored", u1, "GPU", SESSION),
        ("stored", u2, "GPU", SESSION),
        ("tier_stored", u1, "CPU", SESSION),  # CPU_PINNED: the host tier, by kvobs's one name
        ("tier_stored", u2, "CPU", SESSION),
        ("tier_stored", u3, "DISK", SESSION),
        ("removed", u2, "GPU", SESSION),  # evicted from the GPU: the session lost them there
        ("removed", u1, "GPU", SESSION),
        ("tier_stored", u4, "EXTERNAL", None),
    ]
    assert list(events.loc[events["kind"] == "cleared", "reason"]) == ["reset"]
    parents = events[events["kind"] == "tier_stored"].set_index("block_hash")["parent_hash"]
    assert int(parents[u3]) == u2  # the disk block's chain, across tiers
    # the session lost its two device blocks; the host and disk copies are other tiers', not its losses
    footprint = store.reads.session_footprints()
    mine = footprint[footprint["session_id"] == SESSION].iloc[-1]
    assert int(mine["session_evicted_blocks"]) == 2 and int(mine["session_blocks"]) == 0
    store.close()
