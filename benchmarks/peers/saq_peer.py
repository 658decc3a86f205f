"""SAQ (simple async queue) on Redis.

Settings: ``Queue.from_url(url, name="bench")`` defaults; ``saq
benchmarks.peers.saq_peer.settings --workers 1`` with the worker's defaults (``concurrency=10``,
logging at ERROR). Enqueue: ``await queue.enqueue("noop")``; SAQ has no bulk enqueue (``map``
waits for results). Not acknowledged: the queue's ``incomplete`` count (a job leaves it when
finished).
"""

from __future__ import annotations

import os
from typing import Any

from saq import Queue

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency


async def noop(ctx: Any) -> None:
    mark_started()


async def stamp(ctx: Any, *, enqueued: float) -> None:
    record_latency(enqueued)


# What `saq benchmarks.peers.saq_peer.settings` serves.
settings = {
    "queue": Queue.from_url(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/13"), name="bench"),
    "functions": [noop, stamp],
}


class SaqPeer(RedisPeer):
    name = "saq"
    package = "saq"
    enqueue_settings = 'await queue.enqueue("noop"), sequential'
    worker_settings = "saq --workers 1; Worker defaults (concurrency 10)"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.queue = Queue.from_url(url, name="bench")

    async def setup(self) -> None:
        await super().setup()
        await self.queue.connect()

    async def teardown(self) -> None:
        await self.queue.disconnect()
        await super().teardown()

    async def enqueue_one(self) -> None:
        await self.queue.enqueue("noop")

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self.queue.enqueue("stamp", enqueued=enqueued)

    async def pending(self) -> int:
        return int(await self.queue.count("incomplete"))

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [python, "-m", "saq", "benchmarks.peers.saq_peer.settings", "--workers", "1"]
