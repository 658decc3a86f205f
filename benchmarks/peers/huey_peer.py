"""Huey with ``RedisHuey``.

Settings: ``RedisHuey("bench")`` defaults (``blocking=True``: the consumer waits in BRPOP,
``read_timeout=1``; results stored but ``store_none=False``, so a no-op stores nothing);
``huey_consumer -w 1 -k thread`` (its defaults: one worker thread) with ``-q`` (no per-task log
line). Enqueue: calling the task (one LPUSH); Huey has no bulk enqueue. Not acknowledged: the
queue's LLEN. Huey has no acknowledgements: a job leaves Redis when a worker pops it, so the
last job may still be running, for the length of a no-op, when the queue reads empty.
"""

from __future__ import annotations

import os
from typing import Any

from huey import RedisHuey

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency

NAME = "bench"


def build(url: str) -> tuple[RedisHuey, Any, Any]:
    huey = RedisHuey(NAME, url=url)

    @huey.task(name="bench.noop")
    def noop() -> None:
        mark_started()

    @huey.task(name="bench.stamp")
    def stamp(enqueued: float) -> None:
        record_latency(enqueued)

    return huey, noop, stamp


# What `huey_consumer benchmarks.peers.huey_peer.huey` serves.
huey, _, _ = build(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/11"))


class HueyPeer(RedisPeer):
    name = "huey"
    package = "huey"
    enqueue_settings = "noop() (sync), sequential; RedisHuey (LPUSH)"
    worker_settings = (
        "huey_consumer -w 1 -k thread (defaults) -q; RedisHuey defaults (blocking BRPOP)"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.huey, self.noop, self.stamp = build(url)

    async def enqueue_one(self) -> None:
        self.noop()

    async def enqueue_stamped(self, enqueued: float) -> None:
        self.stamp(enqueued)

    async def pending(self) -> int:
        return int(await self.redis.llen(self.huey.storage.queue_key))

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [
            python,
            "-m",
            "huey.bin.huey_consumer",
            "benchmarks.peers.huey_peer.huey",
            "-w",
            "1",
            "-k",
            "thread",
            "-q",
        ]
