"""The kvobs store: SQLAlchemy tables (`schema`), opening and migrating (`db`), the batched writer (`writer`)."""

from kvobs.store.db import DEFAULT_STORE_URL, Store, open_store, store_url  # noqa: F401
from kvobs.store.writer import StoreWriter  # noqa: F401
