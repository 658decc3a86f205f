from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from brokers.sqlite import SqliteBroker

from . import BrokerSpace

NAME = "sqlite"


@asynccontextmanager
async def space(test_id: str, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    url = f"sqlite:///{tmp_path / 'taskkit.db'}"
    yield BrokerSpace(NAME, url, lambda: SqliteBroker(url))
