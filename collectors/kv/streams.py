"""Which KV-event streams a collector follows: `--kv-events [NAME=]ENDPOINT` (repeatable), each with its replay.

    specs = parse_streams(["gpu-0=tcp://vllm-0:5557", "gpu-1=tcp://vllm-1:5557"],
                          ["gpu-0=tcp://vllm-0:5558", "gpu-1=tcp://vllm-1:5558"])

Every stream is its own instance in the store (NAME; else the collector's `--instance` or only scrape target's
name when there is one stream; else the endpoint's host:port), with its own sequence numbers, gaps, replay and
hash chains. A replay names its stream (`NAME=ENDPOINT`); an unnamed one goes with the stream at the same position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlsplit

from collectors.drops import DropCounter
from collectors.kv.poller import KVEventPoller
from collectors.kv.subscriber import BatchHandler, KVEventSubscriber
from kvobs.vllm import normalize

HTTP_SCHEMES = ("http://", "https://")  # a --kv-events endpoint fetched over HTTP (TensorRT-LLM), not ZMQ


@dataclass(frozen=True)
class KVStreamSpec:
    instance: str
    endpoint: str
    replay: str | None = None


def split_name(value: str) -> tuple[str | None, str]:
    """`NAME=ENDPOINT` -> (NAME, ENDPOINT); a bare endpoint (no `=` before its `://`) -> (None, ENDPOINT)."""
    name, sep, rest = value.partition("=")
    if sep and "://" not in name and name:
        return name, rest
    return None, value


def parse_streams(
    kv_events: list[str], replays: list[str], *, default_instance: str | None = None
) -> list[KVStreamSpec]:
    """Raises ValueError on a replay for no stream, two streams of one name, or an empty endpoint."""
    streams = [split_name(v) for v in kv_events]
    named_replays: dict[str, str] = {}
    positional: list[str] = []
    for value in replays:
        name, endpoint = split_name(value)
        (positional.append(endpoint) if name is None else named_replays.__setitem__(name, endpoint))
    if len(positional) > len(streams):
        raise ValueError(f"{len(positional)} unnamed --kv-events-replay for {len(streams)} --kv-events")
    specs = []
    for i, (name, endpoint) in enumerate(streams):
        if not endpoint:
            raise ValueError(f"--kv-events {kv_events[i]!r}: no endpoint")
        instance = name or (default_instance if len(streams) == 1 else None) or _host_port(endpoint)
        replay = named_replays.pop(name, None) if name else None
        specs.append(KVStreamSpec(instance, endpoint, replay or (positional[i] if i < len(positional) else None)))
    if named_replays:
        raise ValueError(f"--kv-events-replay for unknown stream(s): {', '.join(sorted(named_replays))}")
    instances = [s.instance for s in specs]
    if len(set(instances)) != len(instances):
        raise ValueError(f"two --kv-events streams share an instance name: {instances}; name them NAME=ENDPOINT")
    return specs


def subscribe(
    spec: KVStreamSpec,
    on_batch: BatchHandler,
    drops: DropCounter,
    *,
    on_restart: Callable[[], None],
    bind: bool | None = None,
    topic: str = "",
    resume_from: int | None = None,
    token_hashes: bool = False,
) -> KVEventSubscriber | KVEventPoller:
    """The stream's receiver, not started: TensorRT-LLM's events are fetched over HTTP, every other engine's
    subscribed to over ZMQ (`resume_from`: the first sequence number wanted, filled by the replay; `token_hashes`:
    each store's blocks' tokens hashed as Dynamo's router hashes them, `Stored.token_hashes`)."""
    if spec.endpoint.startswith(HTTP_SCHEMES):
        if spec.replay:
            raise ValueError(f"--kv-events {spec.endpoint}: an HTTP stream is fetched and has no replay socket")
        return KVEventPoller(spec.endpoint, on_batch, drops, on_restart=on_restart)
    return KVEventSubscriber(
        spec.endpoint,
        on_batch,
        drops,
        bind=bind,
        replay_endpoint=spec.replay,
        topic=topic,
        on_restart=on_restart,
        resume_from=resume_from,
        decode=partial(normalize.decode, token_hashes=True) if token_hashes else normalize.decode,
    )


def _host_port(endpoint: str) -> str:
    return urlsplit(endpoint).netloc or endpoint
