"""Redis backends: a real server ("redis") and fakeredis ("fakeredis").

"redis" uses TASKKIT_TEST_REDIS_URL (default redis://127.0.0.1:6379/0) with the test's id as the
key prefix, so tests can share one server and run in parallel; the keys under the prefix are
deleted afterwards. A server that does not answer fails the test with the reason.

"fakeredis" needs no server: every broker of one test shares one in-process FakeServer (fast,
but never the only proof: the real server runs the same suite).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from brokers.redis import RedisBroker

from . import BrokerSpace

NAMES = ["redis", "fakeredis"]
URL_ENV = "TASKKIT_TEST_REDIS_URL"
DEFAULT_URL = "redis://127.0.0.1:6379/0"


def server_url() -> str:
    """The test server's URL (no taskkit options)."""
    return os.environ.get(URL_ENV, DEFAULT_URL)


def unique_prefix(name: str) -> str:
    """A key prefix for one test (what conftest uses as the test id), for tests of this backend."""
    raw = re.sub(r"[^a-z0-9]+", "_", name.lower())[-40:].strip("_")
    return f"t{os.getpid()}_{raw}"


def with_prefix(url: str, prefix: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}prefix={prefix}"


async def cmd(client: aioredis.Redis, *args: str | bytes | int | float) -> Any:
    """Send one raw command (typed; redis-py leaves ``execute_command`` untyped)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


async def delete_prefix(client: aioredis.Redis, prefix: str) -> None:
    """Delete every key under ``prefix:`` (SCAN, never KEYS)."""
    batch: list[bytes] = []
    async for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            await client.unlink(*batch)
            batch.clear()
    if batch:
        await client.unlink(*batch)


@asynccontextmanager
async def space(test_id: str, tmp_path: Path, variant: str) -> AsyncIterator[BrokerSpace]:
    if variant == "fakeredis":
        server = fakeredis.FakeServer()
        url = with_prefix("redis://fakeredis/0", test_id)
        yield BrokerSpace(
            variant,
            None,
            lambda: RedisBroker(
                url, connection_factory=lambda: fakeredis.FakeAsyncRedis(server=server)
            ),
        )
        return
    base = server_url()
    client = aioredis.from_url(base)
    try:
        try:
            await client.ping()
        except (aioredis.ConnectionError, aioredis.TimeoutError, OSError) as exc:
            pytest.fail(
                f"the Redis test server at {base} does not answer ({exc}); start redis-server "
                f"or set {URL_ENV} to a running server",
                pytrace=False,
            )
        url = with_prefix(base, test_id)
        try:
            yield BrokerSpace(variant, url, lambda: RedisBroker(url))
        finally:
            await delete_prefix(client, test_id)
    finally:
        await client.aclose()
