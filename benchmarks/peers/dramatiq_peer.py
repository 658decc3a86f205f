"""Dramatiq with its ``RedisBroker``.

Settings: ``RedisBroker`` defaults (default middleware: AgeLimit, TimeLimit,
ShutdownNotifications, Callbacks, Pipelines, Retries; no results backend), queue ``default``;
``dramatiq --processes 1 --threads 8`` (threads: its default; processes default to the CPU
count, one here as for every system). Enqueue: ``actor.send()`` (sync, one Lua call); Dramatiq
has no bulk enqueue. Not acknowledged: ``HLEN dramatiq:default.msgs`` (a message's body stays
there until its ack).
"""

from __future__ import annotations

import os
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency


def build(url: str) -> tuple[RedisBroker, Any, Any]:
    broker = RedisBroker(url=url)

    @dramatiq.actor(actor_name="bench_noop", broker=broker)
    def noop() -> None:
        mark_started()

    @dramatiq.actor(actor_name="bench_stamp", broker=broker)
    def stamp(enqueued: float) -> None:
        record_latency(enqueued)

    return broker, noop, stamp


# What `dramatiq benchmarks.peers.dramatiq_peer` serves: the module's global broker.
broker, _, _ = build(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/12"))
dramatiq.set_broker(broker)


class DramatiqPeer(RedisPeer):
    name = "dramatiq"
    package = "dramatiq"
    enqueue_settings = "noop.send() (sync), sequential; RedisBroker"
    worker_settings = (
        "dramatiq --processes 1 --threads 8 (default threads); RedisBroker defaults, "
        "default middleware"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.broker, self.noop, self.stamp = build(url)

    async def teardown(self) -> None:
        self.broker.close()
        await super().teardown()

    async def enqueue_one(self) -> None:
        self.noop.send()

    async def enqueue_stamped(self, enqueued: float) -> None:
        self.stamp.send(enqueued)

    async def pending(self) -> int:
        return int(await self.redis.hlen("dramatiq:default.msgs"))

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [
            python,
            "-m",
            "dramatiq",
            "benchmarks.peers.dramatiq_peer",
            "--processes",
            "1",
            "--threads",
            "8",
        ]
