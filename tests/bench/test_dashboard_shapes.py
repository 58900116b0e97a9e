"""The page benchmark's store of KV events alone (`bench/dashboard_queries.py --shape kv-only`): filled by the
collector's own ingest from vLLM-format batches, holding block rows and nothing a trace or a scrape would write, and
every page's data read from it."""

from __future__ import annotations

from pathlib import Path

from kvobs.store import open_store


def test_a_kv_only_store_holds_the_ingests_rows_alone_and_every_page_reads_it(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import dashboard_queries as bench
    from collector_ingest import made_rows, synthetic_payloads

    url = f"sqlite:///{tmp_path}/kv.db"
    store = open_store(url)
    bench.build_kv_only(store, 3000)
    with store.engine.connect() as conn:
        counted = {
            table: conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar()
            for table in ("kv_events", "snapshots", "requests", "steps")
        }
        span = conn.exec_driver_sql("SELECT max(ts) - min(ts) FROM kv_events").scalar()
    store.close()
    batches = -(-3000 // 90)
    payloads, _ = synthetic_payloads(
        batches, 50, bench.SLOTS, every_s=bench.HOURS * 3600.0 / batches, session_stores=20
    )
    assert counted == {"kv_events": made_rows(payloads, keep=False).kv_rows, "snapshots": 0, "requests": 0, "steps": 0}
    assert counted["kv_events"] >= 3000 and span > 0.99 * bench.HOURS * 3600 - 3600 * bench.HOURS / batches

    found = bench.measure(url, 3000, 1, render=False, shape=bench.KV_ONLY)
    assert set(found) == {"baseline", *bench.PAGE_KEYS, bench.ROUTING}  # every page, each timed
    assert f"{counted['kv_events']:,} kv_events made by the collector's ingest from KV events alone" in (
        capsys.readouterr().out
    )
