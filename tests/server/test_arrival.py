"""A request's arrival is when it reached the server, under any load: `kvobs serve` stamps it as the HTTP side takes
it, while the engine thread is deep in another tenant's long prefill (it takes new requests only between steps)."""

from __future__ import annotations

import threading
import time

import httpx

from kvobs.store import open_store
from tests.server.conftest import SERVED, running_server

LONG = 3800  # prompt tokens of the other tenant's request: one long prefill step (chunked prefill off)


def _complete(url: str, prompt, session: str, max_tokens: int, sent: dict) -> None:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    sent[session] = time.time()
    response = httpx.post(url + "/v1/completions", json=body, headers={"X-Session-ID": session}, timeout=120)
    assert response.status_code == 200, response.text


def test_arrival_is_stamped_when_the_request_reaches_the_server_while_the_engine_prefills(smollm2_source, tmp_path):
    url = f"sqlite:///{tmp_path / 'arrival.db'}"
    config = {"max_model_len": 4096, "num_blocks": 300, "enable_chunked_prefill": False, "max_num_batched_tokens": 4096}
    sent: dict[str, float] = {}
    with running_server(smollm2_source, options={"store_url": url, "instance": "eng"}, **config) as server:
        _complete(server.url, [7] * 32, "warm", 1, sent)  # the first forward pass pays its one-off costs
        long = threading.Thread(
            target=_complete, args=(server.url, [(i * 13) % 40000 + 100 for i in range(LONG)], "long", 1, sent)
        )
        long.start()
        time.sleep(0.3)  # its prefill has begun: the engine thread is inside one step
        _complete(server.url, [11] * 32, "short", 1, sent)
        long.join()
    store = open_store(url)
    reqs = store.reads.requests().set_index("session_id")
    short, other = reqs.loc["short"], reqs.loc["long"]
    scheduled = short["arrival_ts"] + short["queue_s"]
    # the engine was busy: the short request waited for the long prefill before it was scheduled
    assert scheduled >= other["first_token_ts"] - 0.05, (scheduled, other["first_token_ts"])
    assert scheduled - sent["short"] >= 0.6, "the long prefill was too short to tell the two stamps apart"
    # its arrival: when its client sent it, not when the engine took it
    assert 0 <= short["arrival_ts"] - sent["short"] < 0.5
    assert set(reqs["cached_from"]) == {"server"}  # the engine's own count of its cached tokens, and said so
