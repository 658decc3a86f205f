"""Periodic tasks on every broker: two workers, one job per tick, none skipped."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import pytest

from taskkit import Router, Worker, WorkerSettings, current_job
from taskkit.broker import Broker
from taskkit.testing import FakeClock

pytestmark = pytest.mark.anyio

MakeBroker = Callable[[], Awaitable[Broker]]


async def test_two_workers_run_each_tick_once(make_broker: MakeBroker) -> None:
    clock = FakeClock(1_800_000_000.0)  # a multiple of 60: the first tick is "now"
    router = Router()
    runs: Counter[float] = Counter()

    @router.task(name="report.hourly", every=60)
    async def report() -> None:
        info = await worker_a.broker.get_job(current_job().id, clock.now())
        assert info is not None and info.run_at is not None
        runs[info.run_at] += 1

    # A lease longer than the whole test's fake time: the clock jumps 60 s while a claim is
    # waiting or a run is being acknowledged, and an expired lease would rightly rerun the job
    # (at-least-once), which is not what this test is about.
    settings = WorkerSettings(poll_wait=0.02, lease_for=600)
    worker_a = Worker(router, await make_broker(), settings, clock)
    worker_b = Worker(router, await make_broker(), settings, clock)
    ticks = [clock.now() + 60 * i for i in range(4)]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker_a.run)
            tg.start_soon(worker_b.run)
            for i, tick in enumerate(ticks):
                clock.set(tick + 1)
                while runs[tick] == 0:
                    await anyio.sleep(0.02)
                if i == 1:  # a restart re-enqueues the current tick: still one job
                    worker_b.stop()
                    worker_b = Worker(router, await make_broker(), settings, clock)
                    tg.start_soon(worker_b.run)
            await anyio.sleep(0.3)  # let both schedulers loop again over the last tick
            worker_a.stop()
            worker_b.stop()
    assert dict(runs) == {tick: 1 for tick in ticks}
