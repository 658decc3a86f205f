"""What the PostgreSQL peers share: a database of their own on the same server, created for the
run and dropped at the end, and an asyncpg connection to it to look at their tables."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import asyncpg

from benchmarks.system import System
from benchmarks.workload import URL_ENV


class PostgresPeer(System):
    kind = "postgresql"

    def __init__(self, url: str, admin_url: str) -> None:
        super().__init__(url)
        self.admin_url = admin_url  # a database of the same server to run CREATE DATABASE in
        self.database = urlsplit(url).path.lstrip("/")
        self.conn: Any = None

    async def setup(self) -> None:
        await self._drop_database()
        admin = await asyncpg.connect(self.admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            await admin.close()
        self.conn = await asyncpg.connect(self.url)

    async def teardown(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None
        await self._drop_database()

    async def _drop_database(self) -> None:
        admin = await asyncpg.connect(self.admin_url)
        try:
            # FORCE: a worker killed mid-run may leave a session behind.
            await admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        finally:
            await admin.close()

    def worker_env(self) -> dict[str, str]:
        return {URL_ENV: self.url}
