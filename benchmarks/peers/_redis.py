"""What the Redis peers share: a db number of their own, emptied before each run and at the
end (FLUSHDB), and a plain redis.asyncio client to look at their keys."""

from __future__ import annotations

from redis.asyncio import Redis

from benchmarks.system import System
from benchmarks.workload import URL_ENV


class RedisPeer(System):
    kind = "redis"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.redis: Redis = Redis.from_url(url)

    async def setup(self) -> None:
        await self.clear()

    async def clear(self) -> None:
        await self.redis.flushdb()

    async def teardown(self) -> None:
        await self.redis.flushdb()
        await self.redis.aclose()

    def worker_env(self) -> dict[str, str]:
        return {URL_ENV: self.url}
