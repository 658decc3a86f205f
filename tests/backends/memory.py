from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from brokers.memory import MemoryBroker

from . import BrokerSpace

NAME = "memory"


@asynccontextmanager
async def space(test_id: str, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    url = f"memory://{test_id}"
    yield BrokerSpace(NAME, None, lambda: MemoryBroker(url))
