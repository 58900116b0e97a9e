"""Scraping: legacy names, buckets read from the body, restarts without negative rates, bad bodies and down
servers counted and recorded, over a real HTTP server serving the recorded vLLM scrapes."""

from __future__ import annotations

import math
import re

import pytest
from sqlalchemy import select

from collectors.drops import DropCounter
from collectors.metrics.counters import CounterTracker
from collectors.metrics.derive import Deriver, histogram_quantile
from collectors.metrics.prom_text import MetricsParseError, parse_metrics
from collectors.metrics.scraper import Scraper, ScrapeTarget
from kvobs.store.schema import MetricSampleRow, SnapshotRow
from kvobs.store.writer import StoreWriter
from tests.collectors.recorded import scrapes
from tests.collectors.replay import metrics_server
from tests.collectors.test_collector_recorded import counter_value
from tests.server.conftest import free_port

BODIES = [body for _, body in scrapes()]
LEGACY = {  # current name -> the name releases before the rename emitted
    "vllm:kv_cache_usage_perc": "vllm:gpu_cache_usage_perc",
    "vllm:prefix_cache_queries": "vllm:gpu_prefix_cache_queries",
    "vllm:prefix_cache_hits": "vllm:gpu_prefix_cache_hits",
    "vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds",
}


def as_legacy(body: str) -> str:
    for new, old in LEGACY.items():
        body = body.replace(new + "_", old + "_").replace(new + "{", old + "{").replace(new + " ", old + " ")
    return body


def scrape_all(store, responses, *, url: str | None = None) -> tuple[Scraper, list, list]:
    writer, drops = StoreWriter(store), DropCounter()
    with metrics_server(responses) as base:
        scraper = Scraper([ScrapeTarget.parse(f"vllm={url or base}")], writer, drops)
        for _ in responses:
            scraper.scrape_all()
    writer.close()
    with store.session() as s:
        samples = s.execute(select(MetricSampleRow.name, MetricSampleRow.value).order_by(MetricSampleRow.id)).all()
        snapshots = s.scalars(select(SnapshotRow).order_by(SnapshotRow.id)).all()
    return scraper, samples, snapshots


def total(samples, name: str) -> float:
    return sum(v for n, v in samples if n == name)


def test_legacy_names_read_as_the_current_ones():
    current, legacy = parse_metrics(BODIES[60]), parse_metrics(as_legacy(BODIES[60]))
    assert "vllm:gpu_cache_usage_perc" in as_legacy(BODIES[60])
    assert legacy.gauge("vllm:kv_cache_usage_perc") == current.gauge("vllm:kv_cache_usage_perc") is not None
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        assert (
            [c.value for (n, _), c in legacy.counters.items() if n == name]
            == [c.value for (n, _), c in current.counters.items() if n == name]
            != []
        )
    itl = [h.count for (n, _), h in legacy.histograms.items() if n == "vllm:inter_token_latency_seconds"]
    assert itl == [h.count for (n, _), h in current.histograms.items() if n == "vllm:inter_token_latency_seconds"]


def test_a_release_emitting_both_names_is_read_by_the_current_one():
    body = (
        BODIES[60]
        + '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{engine="0",model_name="x"} 0.77\n'
    )
    assert (
        parse_metrics(body).gauge("vllm:kv_cache_usage_perc")
        == parse_metrics(BODIES[60]).gauge("vllm:kv_cache_usage_perc")
        != 0.77
    )


def test_a_moved_created_timestamp_is_a_restart_even_when_the_value_grew():
    tracker = CounterTracker()
    assert tracker.increase("c", 100.0, created=1.0) is None
    assert tracker.increase("c", 130.0, created=1.0) == 30.0
    assert tracker.increase("c", 150.0, created=2.0) == 150.0  # a new process that already counted past 130
    assert tracker.increase("c", 10.0) == 10.0 and tracker.num_resets == 2


def test_quantiles_use_the_buckets_the_server_reports():
    # rewrite TTFT's bucket bounds: the quantile must move with them (nothing hard-coded)
    first, last = BODIES[0], BODIES[-1]
    found = re.findall(r'time_to_first_token_seconds_bucket\{[^}]*le="([^"]+)"', last)
    bounds = sorted({float(x) for x in found if x != "+Inf"})
    scaled = {f'le="{b}"': f'le="{b * 10}"' for b in bounds}

    def rescale(body: str) -> str:
        out = []
        for line in body.splitlines(keepends=True):
            if line.startswith("vllm:time_to_first_token_seconds_bucket"):
                for old, new in scaled.items():
                    if old in line:
                        line = line.replace(old, new)
                        break
            out.append(line)
        return "".join(out)

    def p50(a: str, b: str) -> float:
        deriver = Deriver()
        deriver.derive("x", parse_metrics(a))
        return next(
            v
            for n, _, v in deriver.derive("x", parse_metrics(b)).samples
            if n == "vllm:time_to_first_token_seconds:p50"
        )

    assert p50(rescale(first), rescale(last)) == pytest.approx(10 * p50(first, last))


def test_histogram_quantile_interpolates_like_promql():
    buckets = [(0.1, 2.0), (0.5, 6.0), (1.0, 8.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (5 - 2) / 4)
    assert histogram_quantile(0.99, buckets) == 1.0  # in +Inf: the highest finite bound
    assert histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


@pytest.mark.parametrize(
    "body",
    [
        "<html><body>502 Bad Gateway</body></html>\n",
        BODIES[-1][: len(BODIES[-1]) // 2],
        "",
        BODIES[-1].split('le="+Inf"')[0].rsplit("\n", 1)[0] + "\n",
    ],
    ids=["html", "cut-mid-line", "empty", "cut-before-inf-bucket"],
)
def test_bodies_that_are_not_a_whole_exposition_are_refused(body):
    with pytest.raises(MetricsParseError):
        parse_metrics(body)


def test_every_recorded_scrape_parses():
    for body in BODIES:
        parse_metrics(body)


def test_a_server_restart_gives_no_negative_increase_and_no_double_count(store):
    restart_at = 40
    stream = BODIES[: restart_at + 1] + BODIES  # the server restarted and counts from zero again
    scraper, samples, snapshots = scrape_all(store, stream)
    hits = [counter_value(BODIES[i], "vllm:prefix_cache_hits_total") for i in (0, restart_at, -1)]
    want = (hits[1] - hits[0]) + hits[2]  # before the restart, then everything the new process counted
    assert total(samples, "vllm:prefix_cache_hits:increase") == want
    assert all(v >= 0 for n, v in samples if n.endswith((":increase", ":count", ":sum")))
    preemptions = sum(counter_value(BODIES[i], "vllm:num_preemptions_total") for i in (restart_at, -1))
    assert snapshots[-1].preemptions_total == preemptions
    assert scraper._deriver.tracker.num_resets > 0


def test_bad_bodies_and_dead_servers_mark_the_instance_down_and_scraping_goes_on(store):
    responses = [
        BODIES[10],
        "<html>oops</html>\n",
        (500, "internal error", "text/plain"),
        BODIES[11][:5000],
        BODIES[12],
        BODIES[13],
    ]
    scraper, samples, snapshots = scrape_all(store, responses)
    assert [v for n, v in samples if n == "up"] == [1, 0, 0, 0, 1, 1]
    assert scraper.drops.get("scrape", "malformed_body") == 2  # the HTTP 500 is a failure, not a malformed body
    assert len(snapshots) == 3 and scraper.up == {"vllm": True}
    # what the counters gained during the outage is counted once, by the first good scrape after it
    hits = [v for n, v in samples if n == "vllm:prefix_cache_hits:increase"]
    at = [counter_value(BODIES[i], "vllm:prefix_cache_hits_total") for i in (10, 12, 13)]
    assert hits == [at[1] - at[0], at[2] - at[1]]


def test_an_unreachable_server_is_recorded_down(store):
    scraper, samples, snapshots = scrape_all(store, [BODIES[0]], url=f"http://127.0.0.1:{free_port()}")
    assert [v for n, v in samples if n == "up"] == [0.0] and snapshots == [] and scraper.up == {"vllm": False}


def test_scrape_targets_parse_names_and_paths():
    assert ScrapeTarget.parse("http://vllm:8000") == ScrapeTarget("vllm:8000", "http://vllm:8000/metrics")
    assert ScrapeTarget.parse("gpu-a=http://10.0.0.5:8000/metrics") == ScrapeTarget(
        "gpu-a", "http://10.0.0.5:8000/metrics"
    )
    with pytest.raises(ValueError, match="not an http"):
        ScrapeTarget.parse("vllm:8000")


def _with_gauges(body: str, **values: str) -> str:
    """The recorded body with these gauges' values replaced (as a broken exporter would send them)."""
    for name, value in values.items():
        body = re.sub(rf"^(vllm:{name}(?:{{[^}}]*}})?) \S+$", rf"\g<1> {value}", body, flags=re.M)
    return body


def test_nan_and_infinite_gauges_are_skipped_and_counted_not_a_lost_snapshot(store):
    """The probe's F11: `int(nan)` raised inside the snapshot on every such scrape; NaN samples hit NOT NULL."""
    broken = _with_gauges(BODIES[12], kv_cache_usage_perc="NaN", num_requests_running="+Inf")
    scraper, samples, snapshots = scrape_all(store, [BODIES[11], broken, BODIES[13]])
    assert [v for n, v in samples if n == "up"] == [1, 1, 1] and len(snapshots) == 3
    assert snapshots[1].kv_usage is None and snapshots[1].num_running is None
    assert snapshots[1].num_waiting is not None and snapshots[2].kv_usage is not None
    assert scraper.drops.get("scrape", "non_finite_sample") >= 2 and scraper.writer.num_dropped == 0
    assert all(math.isfinite(v) for _, v in samples)


def test_a_body_over_the_limit_is_not_read_and_the_target_is_down(store):
    """The probe's F12: a 20 MB exposition stalled every target's scraping for 25 s."""
    huge = "# TYPE junk gauge\n" + "".join(f'junk{{i="{i}"}} 1\n' for i in range(60_000))
    writer, drops = StoreWriter(store), DropCounter()
    with metrics_server([BODIES[10], huge, BODIES[11]]) as base:
        scraper = Scraper([ScrapeTarget.parse(f"vllm={base}")], writer, drops, max_body_bytes=len(huge) // 4)
        outcomes = [scraper.scrape(scraper.targets[0]) for _ in range(3)]
    writer.close()
    assert outcomes == [True, False, True] and drops.get("scrape", "body_too_large") == 1


def test_a_replica_whose_lease_this_collector_lost_is_not_scraped_and_says_so(tmp_path):
    """While another collector holds `vllm-a` (`held` False), its scrapes are skipped and counted (component `scrape`,
    reason `lease_lost`); `vllm-b` is scraped as usual; once held again, `vllm-a` is scraped again."""
    from kvobs.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'kvobs.db'}")
    writer, drops = StoreWriter(store), DropCounter()
    lost = {"vllm-a"}
    with metrics_server([BODIES[60]] * 6) as base:
        targets = [ScrapeTarget.parse(f"{name}={base}") for name in ("vllm-a", "vllm-b")]
        scraper = Scraper(targets, writer, drops, held=lambda instance: instance not in lost)
        scraper.scrape_all()
        scraper.scrape_all()
        writer.flush()
        with store.session() as s:
            seen = set(s.scalars(select(SnapshotRow.instance)).all())
        assert seen == {"vllm-b"} and scraper.num_scrapes == 2
        assert drops.totals()["scrape"] == 2
        lost.clear()
        scraper.scrape_all()
    writer.close()
    with store.session() as s:
        assert set(s.scalars(select(SnapshotRow.instance)).all()) == {"vllm-a", "vllm-b"}
    assert scraper.num_scrapes == 4 and drops.totals()["scrape"] == 2
    store.close()
