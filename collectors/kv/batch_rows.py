"""One KV-event batch's `kv_events` rows as columns, built in event order by the collector's KV ingest and handed
to the writer as one `KVEventColumns` (no object per row: thousands a second)."""

from __future__ import annotations


class BatchRows:
    """One batch's `kv_events` rows as columns, in event order: `KVEventRecord`'s columns (`COLUMNS`), less the
    batch's own `ts` and `instance` and the `request_id` vLLM's events do not carry."""

    COLUMNS = (
        "kind",
        "block_hash",
        "parent_hash",
        "session_id",
        "medium",
        "first_owner",
        "num_tokens",
        "reason",
        "num_blocks",
        "group_idx",
        "kv_cache_spec_kind",
        "lora_name",
        "extra_keys",
    )

    def __init__(self) -> None:
        self.kind: list[str] = []
        self.block_hash: list[int | None] = []
        self.parent_hash: list[int | None] = []
        self.session_id: list[str | None] = []
        self.medium: list[str | None] = []
        self.first_owner: list[int | None] = []
        self.num_tokens: list[int | None] = []
        self.reason: list[str | None] = []
        self.num_blocks: list[int | None] = []
        self.group_idx: list[int | None] = []
        self.kv_cache_spec_kind: list[str | None] = []
        self.lora_name: list[str | None] = []
        self.extra_keys: list[str | None] = []
        self.losers: list[str | None] = []  # the owner of each removed row (not a column)

    def add(
        self,
        kind: str,
        *,
        block_hash: int | None = None,
        parent_hash: int | None = None,
        session_id: str | None = None,
        medium: str | None = None,
        first_owner: int | None = None,
        num_tokens: int | None = None,
        reason: str | None = None,
        num_blocks: int | None = None,
        group_idx: int | None = None,
        kv_cache_spec_kind: str | None = None,
        lora_name: str | None = None,
        extra_keys: str | None = None,
    ) -> None:
        """One row, by column name (the `stored` rows of a chain are added a column at a time, in
        `collectors.kv.ingest.KVIngest._stored`)."""
        self.kind.append(kind)
        self.block_hash.append(block_hash)
        self.parent_hash.append(parent_hash)
        self.session_id.append(session_id)
        self.medium.append(medium)
        self.first_owner.append(first_owner)
        self.num_tokens.append(num_tokens)
        self.reason.append(reason)
        self.num_blocks.append(num_blocks)
        self.group_idx.append(group_idx)
        self.kv_cache_spec_kind.append(kv_cache_spec_kind)
        self.lora_name.append(lora_name)
        self.extra_keys.append(extra_keys)

    def columns(self) -> dict[str, list]:
        """Column name -> values, for `KVEventColumns` (which refuses a name `KVEventRecord` does not have)."""
        return {name: getattr(self, name) for name in self.COLUMNS}
