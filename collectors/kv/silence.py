"""A KV-event stream that hears nothing while its replica serves: the misconfiguration vLLM's bind rule makes easy.

    watch = KVSilenceWatch(streams, scraper, silence_s=60)
    watch.check()            # every collector tick: a warning (and a count) per stream gone silent

vLLM's publisher binds a wildcard endpoint (`tcp://*:5557`) and connects to a concrete one (`tcp://host:5557`); so
does `kvobs collect` unless `--kv-events-bind`. Given the same concrete address on both sides, both connect, nobody
binds, and nothing ever arrives: the collector says it connected and stores nothing. The replica's own /metrics
still counts prefix-cache queries. A stream whose instance's scraped `vllm:prefix_cache_queries` rose `silence_s`
or more after its last batch (the replica served all that while, and nothing arrived) is told once per silence, in
a log line that names the rule and the flag, and counted in `kvobs_collector_kv_streams_silent_total{instance}`.
Queries that rose just after the last batch are no silence: the last requests' lookups are scraped after their
blocks were published, and once traffic stops the stream is quiet because the replica is. A stream whose instance
the collector does not scrape cannot be told from an idle replica, and is not judged; nor is a stream while it
stores a batch (a slow store holds the next batches in the socket, unheard but not silent).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)

SILENCE_S = 60.0


class KVSilenceWatch:
    """Args:
    streams: the collector's `KVStream`s (their `spec.instance`, `subscriber.last_batch_at`, `subscriber.bind`).
    scraper: the collector's `Scraper` (its `queries_rose_at`: instance -> when prefix-cache queries last rose).
    silence_s: how long a stream may hear nothing while its replica serves.
    clock: monotonic seconds (the subscriber's and scraper's clock).
    """

    def __init__(
        self, streams, scraper, *, silence_s: float = SILENCE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.streams = streams
        self.scraper = scraper
        self.silence_s = silence_s
        self.clock = clock
        self.num_silent: Counter[str] = Counter()  # instance -> silences told
        self._told: dict[str, float] = {}  # instance -> the last batch time when its silence was told
        self._started = clock()

    def check(self) -> list[str]:
        """Tell each stream newly silent while its replica serves; returns their instances."""
        if self.scraper is None:
            return []
        now, told = self.clock(), []
        for stream in self.streams:
            instance = stream.spec.instance
            if stream.subscriber.handling_since is not None:
                continue  # storing a batch it heard: a slow store behind the stream is no silence on the wire
            heard = stream.subscriber.last_batch_at or self._started
            rose = self.scraper.queries_rose_at.get(instance)
            if rose is None or rose - heard < self.silence_s:
                continue  # (a stream quiet since the replica stopped serving is not silent)
            if self._told.get(instance) == heard:
                continue  # this silence was told already
            self._told[instance] = heard
            self.num_silent[instance] += 1
            told.append(instance)
            how = "binds" if stream.subscriber.bind else "connects to"
            log.warning(
                "KV events of %s: nothing on %s for %.0f s while its /metrics counted prefix-cache queries. This "
                "collector %s that endpoint; vLLM binds only a wildcard endpoint (tcp://*:PORT) and connects to a "
                "concrete one, so if both sides connect nobody binds and nothing arrives: start kvobs collect with "
                "--kv-events-bind, or give vLLM's --kv-events-config an endpoint of tcp://*:PORT and connect to it. "
                "Or its KV events are off: vLLM publishes them only with enable_kv_cache_events true in "
                "--kv-events-config (false unless set).",
                instance,
                stream.spec.endpoint,
                now - heard,
                how,
            )
        return told
