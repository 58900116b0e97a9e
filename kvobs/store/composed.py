"""Reads composed from a backend's own, written once for every backend: requests with their latencies, KV-event
counts over the per-minute rollup, and blocks lost.

    store.reads.kv_event_counts(since, until, bucket_s=300)       # bucket, kind, reason, events, blocks
    store.reads.kv_event_counts(since, until, instances=["vllm-a"], by_instance=True)   # ... and instance

KV-event counts: the minutes wholly inside [since, until] are read from the rollup (`kv_event_minutes`, a few rows
per minute, whatever the traffic); the partial minutes at either edge, and buckets that are not whole minutes, from
the raw rows. The two are sums of the same things (`events`: rows; `blocks`: `first_owner`, one per block event),
so the answer equals a count over the raw rows exactly (tests/store/test_contract.py holds them to it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from kvobs.semconv.reasons import RELEASE_REASONS
from kvobs.semconv.spans import BLOCK_LOSS_KINDS
from kvobs.store.interface import Instances, Reads
from kvobs.store.schema import MINUTE_S

COUNT_COLUMNS = ["bucket", "kind", "reason", "events", "blocks"]
TIME_COLUMNS = ["instance", "bucket", "first_ts", "last_ts", "samples"]  # `snapshot_times`


class ComposedReads(Reads):
    """The reads every backend shares, on top of its `request_rows`, `raw_counts` and `minute_counts` (the rest of
    `Reads` is the backend's: the type checker refuses a backend class that leaves one out)."""

    def requests(
        self, since=None, until=None, session_id: str | None = None, *, instances: Instances = None
    ) -> pd.DataFrame:
        """Finished requests by arrival time, with `ttft_s`, `itl_s` (mean inter-token latency) and `e2e_s` added."""
        return with_latencies(self.request_rows(since, until, session_id, instances=instances))

    def kv_event_counts(
        self,
        since=None,
        until=None,
        *,
        bucket_s: float = 60.0,
        kinds: Iterable[str] | None = None,
        instances: Instances = None,
        by_instance: bool = False,
    ) -> pd.DataFrame:
        """KV events per time bucket (its start, epoch s), kind and reason: `bucket`, `kind`, `reason`, `events`
        (rows), `blocks` (block events: a block lost by several owning sessions, one row each, counts once); per
        `instance` too with `by_instance`; of `kinds` and `instances` only (None: all). Oldest first."""
        kinds = None if kinds is None else list(kinds)
        scope = None if instances is None else list(instances)

        def raw(since, until, *, upper_open: bool = False) -> pd.DataFrame:
            return self.raw_counts(
                since, until, bucket_s, kinds, upper_open=upper_open, instances=scope, by_instance=by_instance
            )

        if bucket_s < MINUTE_S or bucket_s % MINUTE_S:
            return ordered_counts(raw(since, until), by_instance)
        low = None if since is None else math.ceil(since / MINUTE_S) * MINUTE_S  # whole minutes: [low, high)
        high = None if until is None else math.floor(until / MINUTE_S) * MINUTE_S
        if low is not None and high is not None and low >= high:
            return ordered_counts(raw(since, until), by_instance)
        parts = [self.minute_counts(low, high, bucket_s, kinds, instances=scope, by_instance=by_instance)]
        if since is not None and low is not None and since < low:
            parts.append(raw(since, low, upper_open=True))
        if until is not None:
            parts.append(raw(high, until))
        parts = [part for part in parts if not part.empty]
        if not parts:
            return pd.DataFrame(columns=_count_columns(by_instance))
        frame = pd.concat(parts).astype({"reason": object})
        keys = ["bucket", *(["instance"] if by_instance else []), "kind", "reason"]
        frame = frame.groupby(keys, dropna=False, as_index=False)[["events", "blocks"]].sum()
        return ordered_counts(frame, by_instance)

    def snapshot_times(self, since, until, bucket_s: float, *, instances: Instances = None) -> pd.DataFrame:
        """When each instance reported, per bucket: the whole minutes inside [since, until] from `snapshot_minutes`
        (their first and last time, how many), the edges (and buckets that are not whole minutes) grouped from the
        rows; equal to grouping the rows (tests/store/test_fleet_reads.py)."""
        if since is None or until is None or bucket_s < MINUTE_S or bucket_s % MINUTE_S:
            return self.raw_snapshot_times(since, until, bucket_s, instances=instances)
        low, high = math.ceil(since / MINUTE_S) * MINUTE_S, math.floor(until / MINUTE_S) * MINUTE_S
        if low >= high:
            return self.raw_snapshot_times(since, until, bucket_s, instances=instances)
        minutes = self.minute_rollup("snapshot_minutes", low, high, instances=instances)
        parts = [
            minutes.assign(bucket=(minutes["minute"] // bucket_s) * bucket_s)[TIME_COLUMNS],
            self.raw_snapshot_times(since, math.nextafter(low, -math.inf), bucket_s, instances=instances),
            self.raw_snapshot_times(high, until, bucket_s, instances=instances),
        ]
        frame = pd.concat([p for p in parts if not p.empty] or [parts[0]], ignore_index=True)
        frame = frame.groupby(["instance", "bucket"], as_index=False, sort=True).agg(
            first_ts=("first_ts", "min"), last_ts=("last_ts", "max"), samples=("samples", "sum")
        )
        return frame.astype({"samples": "int64"})[TIME_COLUMNS]

    def block_losses(
        self, since=None, until=None, *, bucket_s: float = 60.0, instances: Instances = None
    ) -> pd.DataFrame:
        """Blocks lost per time bucket, kind and reason, each lost block once: `bucket`, `kind`, `reason`, `blocks`.
        "Blocks lost" everywhere (Overview, What-if): evictions, invalidations and vLLM's removals
        (`BLOCK_LOSS_KINDS`), one per (instance, time, block) however many owning sessions recorded it
        (`first_owner`), so a block lost twice counts twice; blocks the agent released (`RELEASE_REASONS`) are no
        loss (`releases_in`). Resets (`cleared`), dropping every cached block at once, are shown on their own. From
        the rollup."""
        counts = self.kv_event_counts(since, until, bucket_s=bucket_s, kinds=BLOCK_LOSS_KINDS, instances=instances)
        return losses_in(counts)


def with_latencies(frame: pd.DataFrame) -> pd.DataFrame:
    """Request rows with `ttft_s`, `itl_s` (mean inter-token latency) and `e2e_s` added."""
    frame = frame.copy()
    floats = [frame[c].to_numpy(dtype=float, na_value=np.nan) for c in LATENCY_INPUTS]
    frame["ttft_s"], frame["itl_s"], frame["e2e_s"] = latencies(*floats)
    return frame


LATENCY_INPUTS = ("arrival_ts", "first_token_ts", "finished_ts", "completion_tokens")


def latencies(arrival, first_token, finished, completion_tokens) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A request's time to first token, mean inter-token latency (over the tokens after the first; NaN for one
    token) and end-to-end time, from its `LATENCY_INPUTS` (float arrays, NaN where unknown)."""
    decode_tokens = np.where(completion_tokens > 1, completion_tokens - 1, np.nan)
    return first_token - arrival, (finished - first_token) / decode_tokens, finished - arrival


def losses_in(counts: pd.DataFrame) -> pd.DataFrame:
    """The "blocks lost" rows of `kv_event_counts` (what `block_losses` returns for the same window and bucket;
    with `instance` when the counts have it): taken from a session that still wanted them, not released."""
    columns = ["bucket", *(["instance"] if "instance" in counts else []), "kind", "reason", "blocks"]
    taken = counts["kind"].isin(BLOCK_LOSS_KINDS) & ~counts["reason"].isin(list(RELEASE_REASONS))
    return counts.loc[taken, columns].reset_index(drop=True)


def releases_in(counts: pd.DataFrame) -> pd.DataFrame:
    """The rows of `kv_event_counts` of blocks the agent released (its session ended): counted apart from losses."""
    columns = ["bucket", *(["instance"] if "instance" in counts else []), "kind", "reason", "blocks"]
    released = counts["kind"].isin(BLOCK_LOSS_KINDS) & counts["reason"].isin(list(RELEASE_REASONS))
    return counts.loc[released, columns].reset_index(drop=True)


def ordered_counts(frame: pd.DataFrame, by_instance: bool = False) -> pd.DataFrame:
    """Counts in the order and types `kv_event_counts` gives them: by bucket (and instance), then kind."""
    order = ["bucket", "instance", "kind"] if by_instance else ["bucket", "kind"]
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    frame["reason"] = pd.Series([None if pd.isna(r) else r for r in frame["reason"]], dtype=object)
    return frame.astype({"events": "int64", "blocks": "int64"})[_count_columns(by_instance)]


def _count_columns(by_instance: bool) -> list[str]:
    return ["bucket", "instance", *COUNT_COLUMNS[1:]] if by_instance else COUNT_COLUMNS
