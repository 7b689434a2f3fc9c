from tests.server.conftest import api, postgres_database, sqlite_database, store

__all__ = ["api", "postgres_database", "sqlite_database", "store"]
