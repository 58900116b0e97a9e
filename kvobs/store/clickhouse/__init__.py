"""The store on ClickHouse, for fleets: a server over HTTP (`clickhouse://`) or chDB in-process (`chdb:///dir`).

`ddl` is the schema (versioned migrations), `client` the two ways in, `store` the writes, `reads` the answers to
`kvobs.store.interface`'s reads and lookups (`reads`, `lookups`). Install with `pip install 'kvobs[clickhouse]'`.
"""

from kvobs.store.clickhouse.client import StoreUnreachable  # noqa: F401
