"""arq on Redis. Not in ``--peers all`` and not in the ``bench`` extra: arq pins redis-py < 6,
which the other peers' current releases do not accept. Run it from an env of its own::

    python -m venv .bench-venvs/arq && .bench-venvs/arq/bin/pip install -e . arq
    .bench-venvs/arq/bin/python -m benchmarks drain --broker redis://127.0.0.1:6379/0 --peers arq

Settings: arq's defaults (``max_jobs=10``, ``poll_delay=0.5`` s, ``queue_read_limit`` =
max(5 x max_jobs, 100), results kept 3600 s, pickle); ``arq
benchmarks.peers.arq_peer.WorkerSettings``. Enqueue: ``await pool.enqueue_job("noop")``; arq
has no bulk enqueue. Not acknowledged: ``ZCARD arq:queue`` (a job leaves the queue when it
finishes).
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency


async def noop(ctx: dict[str, Any]) -> None:
    mark_started()


async def stamp(ctx: dict[str, Any], enqueued: float) -> None:
    record_latency(enqueued)


class WorkerSettings:
    """What `arq benchmarks.peers.arq_peer.WorkerSettings` serves."""

    functions: ClassVar[list[Any]] = [noop, stamp]
    redis_settings = RedisSettings.from_dsn(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/15"))


class ArqPeer(RedisPeer):
    name = "arq"
    package = "arq"
    enqueue_settings = 'await pool.enqueue_job("noop"), sequential'
    worker_settings = "arq WorkerSettings, defaults: max_jobs 10, poll_delay 0.5 s"
    pool: ArqRedis

    async def setup(self) -> None:
        await super().setup()
        self.pool = await create_pool(RedisSettings.from_dsn(self.url))

    async def teardown(self) -> None:
        await self.pool.aclose()
        await super().teardown()

    async def enqueue_one(self) -> None:
        await self.pool.enqueue_job("noop")

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self.pool.enqueue_job("stamp", enqueued)

    async def pending(self) -> int:
        return int(await self.redis.zcard("arq:queue"))

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [python, "-m", "arq", "benchmarks.peers.arq_peer.WorkerSettings"]
