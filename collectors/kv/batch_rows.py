"""One KV-event batch's `kv_events` rows as columns, built in event order by the collector's KV ingest and handed
to the writer as one `KVEventColumns` (no object per row: thousands a second).

The columns are `KVEventRecord`'s (less what `KVEventColumns` is given apart); each kind of row has one setter here,
which names every column, so a field added to the record fails the first batch (columns of unequal length) until
its setter fills it. The setters spell the columns out rather than loop over them, and extend rather than `+=` (no
store back into the dict): they run for every event, and each is a measurable share of ingest."""

from __future__ import annotations

from kvobs.block_events import Stored
from kvobs.semconv.spans import KVEventKind
from kvobs.store.rows import KVEventRecord

# the batch's own `ts` and `instance` are given to `KVEventColumns` apart; no engine's KV events carry a request
COLUMNS = tuple(name for name in KVEventRecord._columns if name not in ("ts", "instance", "request_id"))
STORED, REMOVED, CLEARED = KVEventKind.STORED.value, KVEventKind.REMOVED.value, KVEventKind.CLEARED.value
TIER_STORED, TIER_REMOVED = KVEventKind.TIER_STORED.value, KVEventKind.TIER_REMOVED.value


class BatchRows:
    __slots__ = ("columns", "losers")

    def __init__(self) -> None:
        self.columns: dict[str, list] = {name: [] for name in COLUMNS}
        self.losers: list[str | None] = []  # the owner of each device-tier removed row (not a column)

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def stored(
        self,
        event: Stored,
        firsts: list[int] | None = None,
        row_kind: str = STORED,
        gaps: list[float | None] | None = None,
    ) -> None:
        """A row per block of a store, in chain order; `firsts`: each row's `first_owner` (0: a block announced again,
        counted once), none: all 1; `row_kind`: `tier_stored` for a tier below the device cache's; `gaps`: each
        block's time since it was lost on this tier (`BlockClock.stored`), none: no block was."""
        c, n, hashes = self.columns, len(event.hashes), event.hashes
        none = [None] * n  # (one list for every column that is none: most of them, most of the time)
        kind, lora = event.kv_cache_spec_kind, event.lora_name
        c["kind"].extend([row_kind] * n)
        c["block_hash"].extend(hashes)
        c["parent_hash"].extend([event.parent, *hashes[:-1]])
        c["session_id"].extend([event.session_id] * n)
        c["medium"].extend([event.medium] * n)
        c["first_owner"].extend([1] * n if firsts is None else firsts)
        c["num_tokens"].extend([event.block_size] * n)
        c["reason"].extend(none)
        c["num_blocks"].extend(none)
        c["group_idx"].extend([event.group_idx] * n)
        c["kv_cache_spec_kind"].extend(none if kind is None else [kind] * n)
        c["lora_name"].extend(none if lora is None else [lora] * n)
        c["extra_keys"].extend(none if event.extra_keys is None else event.extra_keys)
        c["lifetime_s"].extend(none)
        self._restores(n, gaps)

    def _restores(self, n: int, gaps: list[float | None] | None) -> None:
        c = self.columns
        if gaps is None:
            c["restored"].extend([0] * n)
            c["restored_after_s"].extend([None] * n)
        else:
            c["restored"].extend([0 if gap is None else 1 for gap in gaps])
            c["restored_after_s"].extend(gaps)

    def placeholders(
        self, hashes: list[int], medium: str | None, firsts: list[int], gaps: list[float | None] | None = None
    ) -> None:
        """A row per hash an offload tier announced without its content (`tier_stored`: no parent, no tokens)."""
        c, n = self.columns, len(hashes)
        none = [None] * n
        c["kind"].extend([TIER_STORED] * n)
        c["block_hash"].extend(hashes)
        c["medium"].extend([medium] * n)
        c["first_owner"].extend(firsts)
        for name in ("parent_hash", "session_id", "num_tokens", "reason", "num_blocks", "group_idx"):
            c[name].extend(none)
        for name in ("kv_cache_spec_kind", "lora_name", "extra_keys", "lifetime_s"):
            c[name].extend(none)
        self._restores(n, gaps)

    def removed(
        self,
        hashes: list[int],
        parents: list[int | None],
        sessions: list[str | None],
        firsts: list[int],
        lifetimes: list[float | None],
        *,
        medium: str | None,
        num_tokens: int | None,
        group_idx: int | None,
        reason: str | None,
        row_kind: str = REMOVED,
    ) -> None:
        """A row per removed block and owner (`firsts`: 1 on a block's first row, 0 on its further owners';
        `lifetimes`: each row's block's, `BlockClock.lost`); `row_kind`: `tier_removed` for a tier below the device
        cache's."""
        c, n = self.columns, len(hashes)
        c["kind"].extend([row_kind] * n)
        c["block_hash"].extend(hashes)
        c["parent_hash"].extend(parents)
        c["session_id"].extend(sessions)
        c["first_owner"].extend(firsts)
        for name, value in (("medium", medium), ("num_tokens", num_tokens), ("group_idx", group_idx)):
            c[name].extend([value] * n)
        c["reason"].extend([reason] * n)
        c["lifetime_s"].extend(lifetimes)
        for name in ("num_blocks", "kv_cache_spec_kind", "lora_name", "extra_keys", "restored", "restored_after_s"):
            c[name].extend([None] * n)

    def add(self, kind: str, **fields) -> None:
        """One row by column name (the rare ones: a clear, a held removal released); a column not named is NULL."""
        fields["kind"] = kind
        if not fields.keys() <= self.columns.keys():
            raise TypeError(f"not a kv_events column: {', '.join(sorted(fields.keys() - self.columns.keys()))}")
        for name, values in self.columns.items():
            values.append(fields.get(name))
