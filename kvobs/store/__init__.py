"""The kvobs store: its protocols (`interface`), opening by URL (`db`), the batched writer (`writer`), and the
backends: SQL (`sql/`: `store`, `reads`, `lookups`, `write`; tables in `schema`) and `clickhouse/`."""

from kvobs.store.db import DEFAULT_STORE_URL, open_store, store_url  # noqa: F401
from kvobs.store.interface import Store  # noqa: F401
from kvobs.store.writer import StoreWriter  # noqa: F401
