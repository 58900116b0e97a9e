"""SGLang's own KV-event publisher (`sglang.srt.disaggregation.kv_events.ZmqEventPublisher`, its event classes and
its hashes), run by tests/collectors/test_sglang_wire.py from `.venv-sglang` (scripts/install.sh). Publishes the
batches of `batches()` to ENDPOINT (connecting: the collector binds), answers replays on REPLAY, prints each batch's
hashes as JSON, then waits for its standard input to close.

    PYTHONPATH=.venv-sglang python tests/collectors/sglang_publisher.py tcp://127.0.0.1:5557 tcp://127.0.0.1:5558
"""

from __future__ import annotations

import json
import sys
import time

from sglang.srt.disaggregation import kv_events as sgl

SESSION, SALT = "sgl-session-1", "tenant-a"
TOKENS = 16  # tokens a block (SGLang's page size here)


def batches() -> list:
    """A session's two blocks stored on the GPU, copied to pinned host memory and the third to disk, then evicted
    from the GPU (still on the host), a block in the external pool, and a cache reset: SGLang's four tiers."""
    seed = sgl.kv_event_namespace_seed(extra_key=None, cache_salt=SALT)
    h1, h2, h3, h4 = (sgl.namespaced_block_hash(i, namespace_seed=seed) for i in (11, 12, 13, 14))

    def stored(hashes, parent, medium, session=SESSION):
        return sgl.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(range(TOKENS * len(hashes))),
            block_size=TOKENS,
            lora_id=None,
            medium=medium,
            cache_salt=SALT,
            session_id=session,
        )

    now = time.time()
    return [
        sgl.KVEventBatch(ts=now, events=[stored([h1, h2], None, sgl.StorageMedium.GPU.value)]),
        sgl.KVEventBatch(
            ts=now + 0.1,
            events=[
                stored([h1, h2], None, sgl.StorageMedium.CPU.value),
                stored([h3], h2, sgl.StorageMedium.DISK.value),
            ],
        ),
        sgl.KVEventBatch(
            ts=now + 0.2,
            events=[sgl.BlockRemoved(block_hashes=[h], medium=sgl.StorageMedium.GPU.value) for h in (h2, h1)],
        ),
        sgl.KVEventBatch(
            ts=now + 0.3,
            events=[stored([h4], None, sgl.StorageMedium.EXTERNAL.value, session=None), sgl.AllBlocksCleared()],
        ),
    ]


def main(endpoint: str, replay: str) -> None:
    publisher = sgl.ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic="kv", bind=False)
    time.sleep(1.0)  # (a PUB that connects: the subscription reaches it once connected)
    sent = batches()
    for batch in sent:
        publisher.publish(batch)
    print(json.dumps([[e.block_hashes for e in b.events if hasattr(e, "block_hashes")] for b in sent]), flush=True)
    sys.stdin.read()  # until the test is done with it (and its replays)
    publisher.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
