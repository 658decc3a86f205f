"""Celery with the Redis transport.

Settings: ``Celery("bench", broker=url)``, no result backend (``task_ignore_result``), other
settings at their defaults (prefetch multiplier 4, early acknowledgement); ``celery worker
--pool solo`` (one process; the default prefork pool forks one child per CPU) with
``--without-gossip --without-mingle --without-heartbeat`` (the docs' advice for the Redis
transport: no broadcast chatter) and ``--loglevel WARNING``. Enqueue: ``noop.delay()`` (sync);
Celery has no bulk enqueue (a group publishes one message per task). Not acknowledged: the
``celery`` list's LLEN plus the transport's ``unacked`` hash.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency


def build(url: str) -> tuple[Celery, Any, Any]:
    app = Celery("bench", broker=url)
    app.conf.update(task_ignore_result=True, broker_connection_retry_on_startup=True)

    @app.task(name="bench.noop")
    def noop() -> None:
        mark_started()

    @app.task(name="bench.stamp")
    def stamp(enqueued: float) -> None:
        record_latency(enqueued)

    return app, noop, stamp


# What `celery -A benchmarks.peers.celery_peer:app worker` serves.
app, _, _ = build(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/14"))


class CeleryPeer(RedisPeer):
    name = "celery"
    package = "celery"
    enqueue_settings = "noop.delay() (sync), sequential"
    worker_settings = (
        "celery worker --pool solo --without-gossip --without-mingle --without-heartbeat "
        "--loglevel WARNING; defaults: prefetch multiplier 4, early ack; no result backend"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.app, self.noop, self.stamp = build(url)

    async def teardown(self) -> None:
        self.app.close()
        await super().teardown()

    async def enqueue_one(self) -> None:
        self.noop.delay()

    async def enqueue_stamped(self, enqueued: float) -> None:
        self.stamp.delay(enqueued)

    async def pending(self) -> int:
        async with self.redis.pipeline(transaction=False) as pipe:
            queued, unacked = await pipe.llen("celery").hlen("unacked").execute()
        return int(queued) + int(unacked)

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [
            python,
            "-m",
            "celery",
            "-A",
            "benchmarks.peers.celery_peer:app",
            "worker",
            "--pool",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
        ]
