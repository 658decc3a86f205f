"""TaskIQ with taskiq-redis's ``RedisStreamBroker`` (the acknowledging broker: a job is XACKed
after it ran; the list brokers lose jobs a dying worker held).

Settings: the broker's defaults (consumer group ``taskiq``, ``xread_count=100``,
``xread_block=2000`` ms), stream ``bench``, no result backend; ``taskiq worker --workers 1``
(default 2: one worker process here, as for every system), ``--max-async-tasks 100`` and
``--ack-type when_saved`` (defaults), ``--log-level WARNING``. Enqueue: ``await task.kiq()``;
TaskIQ has no bulk enqueue. Not acknowledged = the consumer group's ``lag`` (entries not yet
delivered) + ``pending`` (delivered, not XACKed), from one XINFO GROUPS.
"""

from __future__ import annotations

import os

from taskiq import AsyncTaskiqDecoratedTask
from taskiq_redis import RedisStreamBroker

from benchmarks.peers._redis import RedisPeer
from benchmarks.workload import URL_ENV, mark_started, record_latency

STREAM, GROUP = "bench", "taskiq"


def build(url: str) -> tuple[RedisStreamBroker, AsyncTaskiqDecoratedTask, AsyncTaskiqDecoratedTask]:
    broker = RedisStreamBroker(url, queue_name=STREAM, consumer_group_name=GROUP)

    @broker.task(task_name="bench.noop")
    async def noop() -> None:
        mark_started()

    @broker.task(task_name="bench.stamp")
    async def stamp(enqueued: float) -> None:
        record_latency(enqueued)

    return broker, noop, stamp


# What `taskiq worker benchmarks.peers.taskiq_peer:broker` serves.
broker, _, _ = build(os.environ.get(URL_ENV, "redis://127.0.0.1:6379/10"))


class TaskiqPeer(RedisPeer):
    name = "taskiq"
    package = "taskiq"
    enqueue_settings = "await noop.kiq(), sequential; RedisStreamBroker (XADD)"
    worker_settings = (
        "taskiq worker --workers 1 (default 2) --log-level WARNING; defaults: "
        "--max-async-tasks 100, --ack-type when_saved; RedisStreamBroker defaults "
        "(xread_count 100), no result backend"
    )

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.broker, self.noop, self.stamp = build(url)

    @property
    def version(self) -> str:
        return f"{super().version} (taskiq-redis {_version('taskiq-redis')})"

    async def setup(self) -> None:
        await super().setup()
        await self.broker.startup()

    async def clear(self) -> None:
        await super().clear()
        # The group must exist before jobs are queued: a worker creating it would start at "$",
        # the end of the stream, and never see the backlog.
        await self.redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)

    async def teardown(self) -> None:
        await self.broker.shutdown()
        await super().teardown()

    async def enqueue_one(self) -> None:
        await self.noop.kiq()

    async def enqueue_stamped(self, enqueued: float) -> None:
        await self.stamp.kiq(enqueued)

    async def pending(self) -> int:
        groups = await self.redis.xinfo_groups(STREAM)
        group = next(g for g in groups if g["name"] in (GROUP, GROUP.encode()))
        lag = group.get("lag")
        if lag is None:  # Redis < 7 or an undefined lag: count what is past the last delivery
            lag = len(await self.redis.xrange(STREAM, f"({group['last-delivered-id'].decode()}"))
        return int(lag) + int(group["pending"])

    def worker_argv(self, python: str, burst: bool = False) -> list[str]:
        return [
            python,
            "-m",
            "taskiq",
            "worker",
            "benchmarks.peers.taskiq_peer:broker",
            "--workers",
            "1",
            "--log-level",
            "WARNING",
        ]


def _version(package: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(package)
