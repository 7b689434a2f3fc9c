"""Open the store the configuration names: SQLite in the data directory unless told otherwise."""

from __future__ import annotations

from ringfence.config import Config
from ringfence.store._protocol import Store

__all__ = ["open_store"]


async def open_store(config: Config) -> Store:
    """Open (and migrate) the configured store.

    Raises:
        StoreError: the database cannot be opened or migrated.
    """
    from ringfence.store.sql import SqlStore, sqlite_url

    url = config.database_url or sqlite_url(config.data_dir)
    return await SqlStore.open(url)
