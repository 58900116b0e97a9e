"""Scrape `/metrics` of vLLM servers (or `kvobs serve`) every interval into the store.

    scraper = Scraper([ScrapeTarget("vllm-a", "http://10.0.0.5:8000/metrics")], writer, drops, interval_s=5)
    scraper.start()        # a thread scrapes every target each interval
    scraper.scrape_all()   # or one round, on the caller's thread
    scraper.stop()

Each scrape writes `metric_samples` (see `collectors.metrics.derive`; plus `up` = 1 or 0 as Prometheus records it) and
one instance `snapshots` row (usage, blocks, running, waiting: the engine's gauges, `engine_gauges`; the interval's
hit rate, cumulative preemptions and evictions), and a `runs` row when the target's run is new
(`collectors.metrics.runs`). A scrape fails when the server cannot be reached, answers non-200, or sends a body that
is not a whole exposition (counted in `drops` under `scrape`); the instance is then marked down: `up` = 0 is written
and the change logged once. What counters gained during an outage is counted by the next good scrape (or, if the
server restarted meanwhile, what it counted since). A body over `MAX_SCRAPE_BYTES` (70 times vLLM's own, which is
about 60 KB) is not read further and fails the scrape (`body_too_large`), so one server cannot stall the others; a NaN
or infinite sample is skipped and counted (`non_finite_sample`), and the snapshot leaves that column empty.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from collectors.drops import DropCounter
from collectors.metrics import engine_gauges
from collectors.metrics.derive import Derived, Deriver
from collectors.metrics.prom_text import MetricsParseError, ParsedMetrics, parse_metrics
from collectors.metrics.runs import RunWatcher
from kvobs.semconv.metrics import kvobs_metrics, vllm
from kvobs.store.rows import MetricSampleRecord, SnapshotRecord
from kvobs.store.writer import StoreWriter

log = logging.getLogger(__name__)

UP = "up"
COMPONENT = "scrape"
MAX_SCRAPE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ScrapeTarget:
    instance: str
    url: str

    @classmethod
    def parse(cls, text: str) -> ScrapeTarget:
        """`[NAME=]URL`; the URL gets `/metrics` when it has no path; NAME defaults to the URL's host:port."""
        name, _, url = text.rpartition("=") if "=" in text.split("://")[0] else ("", "", text)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) URL: {url!r} (example: http://localhost:8000)")
        if parts.path in ("", "/"):
            url = url.rstrip("/") + "/metrics"
        return cls(name or parts.netloc, url)


class Scraper:
    def __init__(
        self,
        targets: list[ScrapeTarget],
        writer: StoreWriter,
        drops: DropCounter,
        *,
        interval_s: float = 5.0,
        timeout_s: float | None = None,
        max_body_bytes: int = MAX_SCRAPE_BYTES,
        clock: Callable[[], float] = time.time,
        held: Callable[[str], bool] = lambda instance: True,
    ) -> None:
        self.targets = targets
        self.held = held  # whether this collector holds the instance's lease (kvobs.store.leases)
        self.clock = clock  # stamps each scrape (a replay gives the recorded scrape times)
        self.writer = writer
        self.drops = drops
        self.interval_s = interval_s
        self.max_body_bytes = max_body_bytes
        self.up: dict[str, bool] = {}
        self.num_scrapes = 0
        self._deriver = Deriver()
        self.runs = RunWatcher(writer)
        self.queries_rose_at: dict[str, float] = {}  # instance -> when (monotonic) its prefix-cache queries last rose
        self._client = httpx.Client(timeout=timeout_s or max(1.0, min(10.0, interval_s)))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kvobs-scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 15)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_all()
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def scrape_all(self) -> None:
        for target in self.targets:
            if not self.held(target.instance):
                self.drops.count(COMPONENT, "lease_lost", f"{target.instance} is written by another collector")
                continue
            try:
                self.scrape(target)
            except Exception:  # one target's bug must not stop the others
                log.exception("scraping %s failed", target.url)

    def scrape(self, target: ScrapeTarget) -> bool:
        """One scrape; True when it succeeded."""
        now = self.clock()
        text, error = self._fetch(target)
        return self.take(target, text, now, error=error)

    def take(self, target: ScrapeTarget, text: str | None, now: float, *, error: str | None = None) -> bool:
        """One scrape's body (None: the scrape failed, `error` says why), stamped `now`: a live scrape's, or one a
        capture recorded (`collectors.capture`); True when it was read."""
        self.num_scrapes += 1
        parsed = None
        if text is not None:
            try:
                parsed = parse_metrics(text)
            except MetricsParseError as exc:
                self.drops.count(COMPONENT, "malformed_body", f"{target.url}: {exc}")
                error = str(exc)
        self._set_up(target, error, now)
        if parsed is None:
            return False  # counters keep their last values: the next good scrape counts the outage's increase
        self.runs.on_scrape(target.instance, parsed)
        derived = self._deriver.derive(target.instance, parsed)
        if derived.increases.get(vllm.PREFIX_CACHE_QUERIES.name, 0) > 0:  # it served (see collectors.kv.silence)
            self.queries_rose_at[target.instance] = time.monotonic()
        for name, labels, value in derived.samples:
            if not math.isfinite(value):
                self.drops.count(COMPONENT, "non_finite_sample", f"{target.instance} {name} = {value}")
                continue
            self.writer.add(MetricSampleRecord(ts=now, instance=target.instance, name=name, value=value, labels=labels))
        self.writer.add(_snapshot(now, target.instance, parsed, derived))
        return True

    def _fetch(self, target: ScrapeTarget) -> tuple[str | None, str | None]:
        """(the body, None), or (None, why the scrape failed)."""
        try:
            with self._client.stream("GET", target.url) as response:
                if response.status_code != 200:
                    return None, f"HTTP {response.status_code}"
                body = bytearray()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > self.max_body_bytes:
                        why = f"{target.url}: the body is over the {self.max_body_bytes}-byte limit"
                        self.drops.count(COMPONENT, "body_too_large", why)
                        return None, why
                return body.decode(response.encoding or "utf-8", errors="replace"), None
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"

    def _set_up(self, target: ScrapeTarget, error: str | None, now: float) -> None:
        up = error is None
        if self.up.get(target.instance) != up:
            if up:
                log.info("%s is up (%s)", target.instance, target.url)
            else:
                log.warning("%s is down: %s (%s)", target.instance, error, target.url)
        self.up[target.instance] = up
        self.writer.add(MetricSampleRecord(ts=now, instance=target.instance, name=UP, value=1.0 if up else 0.0))


def _snapshot(ts: float, instance: str, parsed: ParsedMetrics, derived: Derived) -> SnapshotRecord:
    gauges = engine_gauges.read(parsed)
    usage = _finite(gauges.usage)
    resident = _finite(parsed.gauge(kvobs_metrics.KV_CACHE_RESIDENT_BLOCKS.name))
    evictions = derived.totals.get(kvobs_metrics.KV_BLOCKS_EVICTED.name)
    return SnapshotRecord(
        ts=ts,
        instance=instance,
        kv_usage=usage,
        blocks_total=gauges.blocks_total,
        blocks_free=gauges.blocks_free,
        blocks_resident=None if resident is None else int(resident),
        hit_rate=_finite(derived.hit_rate),
        num_running=_int(gauges.running),
        num_waiting=_int(gauges.waiting),
        preemptions_total=_int(derived.totals.get(vllm.NUM_PREEMPTIONS.name)),
        evictions_total=_int(evictions),
    )


def _finite(value: float | None) -> float | None:
    """The value, or None when it is missing, NaN or infinite (a column a snapshot cannot fill honestly)."""
    return value if value is not None and math.isfinite(value) else None


def _int(value: float | None) -> int | None:
    value = _finite(value)
    return None if value is None else int(value)
