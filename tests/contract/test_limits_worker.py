"""Rate and concurrency limits hold across several workers of one broker, on every broker.

Three workers, each with its own broker connection, serve one queue in this process; the
subprocess version (tests/process/test_limits.py) adds kill -9. Jobs over a limit are snoozed:
they run later and no attempt is used.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import pytest

from taskkit import App, Router, Worker, WorkerSettings
from taskkit.broker import Broker
from taskkit.clock import SystemClock
from tests.servers import eventually

pytestmark = pytest.mark.anyio
MakeBroker = Callable[[], Awaitable[Broker]]


@asynccontextmanager
async def fleet(router: Router, make_broker: MakeBroker, size: int = 3) -> AsyncIterator[None]:
    workers = [
        Worker(router, await make_broker(), WorkerSettings(concurrency=3, poll_wait=0.05))
        for _ in range(size)
    ]
    async with anyio.create_task_group() as tg:
        for w in workers:
            tg.start_soon(w.run)
        yield
        for w in workers:
            w.stop()


async def test_a_rate_limit_holds_across_workers_and_uses_no_attempts(
    make_broker: MakeBroker,
) -> None:
    router = Router()
    starts: list[float] = []

    @router.task(name="api.call", rate_limit="5/s", keep_result=60, max_attempts=1)
    async def call(n: int) -> int:
        starts.append(time.monotonic())
        return n

    app = App(router, await make_broker(), clock=SystemClock())
    handles = [await app.enqueue(call, n) for n in range(8)]
    async with fleet(router, make_broker):
        await eventually(lambda: len(starts) == 8, 30)
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # One run per 0.2 s: never 2 in less than that (a few ms of scheduling noise allowed), so
    # no second holds more than 5.
    assert min(gaps) >= 0.2 - 0.03, gaps
    for h in handles:
        info = await h.info()
        assert info is not None and info.attempts == 1  # max_attempts=1: snoozes used none


async def test_a_task_concurrency_limit_holds_across_workers(make_broker: MakeBroker) -> None:
    router = Router()
    now_running, peak, finished = 0, 0, 0

    @router.task(name="render.video", concurrency=2, max_attempts=1)
    async def render(n: int) -> None:
        nonlocal now_running, peak, finished
        now_running += 1
        peak = max(peak, now_running)
        await anyio.sleep(0.1)
        now_running -= 1
        finished += 1

    app = App(router, await make_broker(), clock=SystemClock())
    for n in range(8):
        await app.enqueue(render, n)
    async with fleet(router, make_broker):
        await eventually(lambda: finished == 8, 30)
    assert peak == 2  # reached, never passed, with 9 runner slots in the fleet


async def test_a_queue_concurrency_limit_covers_every_task_of_the_queue(
    make_broker: MakeBroker,
) -> None:
    router = Router()
    router.limit_queue("video", concurrency=1)
    now_running, peak, finished = 0, 0, 0

    async def body() -> None:
        nonlocal now_running, peak, finished
        now_running += 1
        peak = max(peak, now_running)
        await anyio.sleep(0.05)
        now_running -= 1
        finished += 1

    @router.task(name="video.encode", queue="video")
    async def encode() -> None:
        await body()

    @router.task(name="video.thumb", queue="video")
    async def thumb() -> None:
        await body()

    app = App(router, await make_broker(), clock=SystemClock())
    for _ in range(3):
        await app.enqueue(encode)
        await app.enqueue(thumb)
    async with fleet(router, make_broker):
        await eventually(lambda: finished == 6, 30)
    assert peak == 1
