"""One KV-event batch's `kv_events` rows as columns, built in event order by the collector's KV ingest and handed
to the writer as one `KVEventColumns` (no object per row: thousands a second).

What varies from row to row (the block, its parent, owner, clock) is a list a column; what an event's rows share (its
kind, tier, tokens, reason, group) is one tuple an event, which `columns()` hands on as runs (`kvobs.store.runs`):
a value an event rather than a list an event and column, and a columnar store takes the runs as they are. Each kind
of row has one setter here, which names every column, so a field added to the record fails the first batch (columns
of unequal length) until its setter fills it. The setters spell the columns out rather than loop over them: they
run for every event, and each is a measurable share of ingest."""

from __future__ import annotations

from kvobs.block_events import Stored
from kvobs.semconv.spans import KVEventKind
from kvobs.store.rows import KVEventRecord
from kvobs.store.runs import Runs

# a value a row; a value an event's rows (runs); the batch's own `ts` and `instance` are given to `KVEventColumns`
# apart, and no engine's KV events carry a request
ROW_COLUMNS: tuple[str, ...] = ("block_hash", "parent_hash", "session_id", "first_owner", "extra_keys", "lifetime_s")
ROW_COLUMNS += ("restored", "restored_after_s", "shared_start_tokens")
EVENT_COLUMNS = ("kind", "medium", "num_tokens", "reason", "num_blocks", "group_idx", "kv_cache_spec_kind", "lora_name")
COLUMNS = tuple(name for name in KVEventRecord._columns if name in ROW_COLUMNS or name in EVENT_COLUMNS)
STORED, REMOVED, CLEARED = KVEventKind.STORED.value, KVEventKind.REMOVED.value, KVEventKind.CLEARED.value
TIER_STORED, TIER_REMOVED = KVEventKind.TIER_STORED.value, KVEventKind.TIER_REMOVED.value


class BatchRows:
    __slots__ = ("rows", "events", "lengths", "losers")

    def __init__(self) -> None:
        self.rows: dict[str, list] = {name: [] for name in ROW_COLUMNS}
        self.events: list[tuple] = []  # each run's `EVENT_COLUMNS` values (an event's, or equal events' in a row)
        self.lengths: list[int] = []  # each run's rows
        self.losers: list[str | None] = []  # the owner of each device-tier removed row (not a column)

    def __len__(self) -> int:
        return len(self.rows["block_hash"])

    def columns(self) -> dict[str, list | Runs]:
        """Every column: `ROW_COLUMNS` as lists, `EVENT_COLUMNS` as runs."""
        made: dict[str, list | Runs] = dict(self.rows)
        shared = zip(*self.events) if self.events else [[] for _ in EVENT_COLUMNS]
        for name, values in zip(EVENT_COLUMNS, shared):
            made[name] = Runs(list(values), self.lengths, len(self))
        return made

    def _run(self, shared: tuple, n: int) -> None:
        """`n` rows sharing `shared`: the previous run's if it is equal (a removal after a removal, mostly)."""
        if self.events and self.events[-1] == shared:
            self.lengths[-1] += n
        else:
            self.events.append(shared)
            self.lengths.append(n)

    def stored(
        self,
        event: Stored,
        firsts: list[int] | None = None,
        row_kind: str = STORED,
        gaps: list[float | None] | None = None,
        shared_start: int = 0,
    ) -> None:
        """A row per block of a store, in chain order; `firsts`: each row's `first_owner` (0: a block announced again,
        counted once), none: all 1; `row_kind`: `tier_stored` for a tier below the device cache's; `gaps`: each
        block's time since it was lost on this tier (`BlockClock.stored`), none: no block was; `shared_start`: the
        tokens a chain's first block began with as an earlier chain's did, less than a block (0: none)."""
        c, n, hashes = self.rows, len(event.hashes), event.hashes
        none = [None] * n  # (one list for every column that is none: most of them, most of the time)
        c["block_hash"].extend(hashes)
        c["parent_hash"].extend([event.parent, *hashes[:-1]])
        c["session_id"].extend([event.session_id] * n)
        c["first_owner"].extend([1] * n if firsts is None else firsts)
        c["extra_keys"].extend(none if event.extra_keys is None else event.extra_keys)
        c["lifetime_s"].extend(none)
        c["shared_start_tokens"].extend(none if not shared_start else [shared_start, *none[1:]])
        self._restores(n, gaps)
        shared = (row_kind, event.medium, event.block_size, None, None, event.group_idx, event.kv_cache_spec_kind)
        self._run((*shared, event.lora_name), n)

    def _restores(self, n: int, gaps: list[float | None] | None) -> None:
        c = self.rows
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
        c, n = self.rows, len(hashes)
        none = [None] * n
        c["block_hash"].extend(hashes)
        c["first_owner"].extend(firsts)
        for name in ("parent_hash", "session_id", "extra_keys", "lifetime_s", "shared_start_tokens"):
            c[name].extend(none)
        self._restores(n, gaps)
        self._run((TIER_STORED, medium, None, None, None, None, None, None), n)

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
        c, n = self.rows, len(hashes)
        none = [None] * n
        c["block_hash"].extend(hashes)
        c["parent_hash"].extend(parents)
        c["session_id"].extend(sessions)
        c["first_owner"].extend(firsts)
        c["extra_keys"].extend(none)
        c["lifetime_s"].extend(lifetimes)
        c["restored"].extend(none)
        c["restored_after_s"].extend(none)
        c["shared_start_tokens"].extend(none)
        self._run((row_kind, medium, num_tokens, reason, None, group_idx, None, None), n)

    def add(self, kind: str, **fields) -> None:
        """One row by column name (the rare ones: a clear, a held removal released); a column not named is NULL."""
        fields["kind"] = kind
        if not fields.keys() <= set(COLUMNS):
            raise TypeError(f"not a kv_events column: {', '.join(sorted(fields.keys() - set(COLUMNS)))}")
        for name, values in self.rows.items():
            values.append(fields.get(name))
        self._run(tuple(fields.get(name) for name in EVENT_COLUMNS), 1)
