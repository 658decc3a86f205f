"""The producer's side on every broker: the sync API, and what a task can say while it runs
(its context, Snooze, Retry)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import pytest

from taskkit import (
    App,
    ArgumentsInvalid,
    Job,
    JobContext,
    JobDead,
    ResultTimeout,
    Retry,
    Router,
    Snooze,
    SyncApp,
    current_job,
)
from taskkit.broker import Broker
from taskkit.clock import SystemClock
from taskkit.job import JobState
from taskkit.testing import FakeClock
from tests.backends import BrokerSpace

from .test_worker import drain

pytestmark = pytest.mark.anyio

MakeBroker = Callable[[], Awaitable[Broker]]


async def test_the_sync_api_works_without_an_event_loop(
    make_broker: MakeBroker, space: BrokerSpace
) -> None:
    router = Router()

    @router.task(name="sync.add", keep_result=60)
    async def add(a: int, b: int) -> int:
        return a + b

    producer = SyncApp(router, space.make())  # used from a plain thread, as a Flask view would
    try:
        handle = await anyio.to_thread.run_sync(lambda: producer.enqueue(add, 2, 3))
        worker_broker = await make_broker()
        await drain(router, worker_broker, SystemClock())
        assert await anyio.to_thread.run_sync(lambda: handle.get(timeout=5)) == 5
        info = await anyio.to_thread.run_sync(handle.info)
        assert info is not None and info.state is JobState.DONE
    finally:
        await anyio.to_thread.run_sync(producer.close)


async def test_a_task_sees_its_jobs_context(broker: Broker, clock: FakeClock) -> None:
    router = Router()
    seen: list[JobContext] = []

    @router.task(name="ctx.show", queue="q1", max_attempts=4)
    def show() -> None:
        seen.append(current_job())

    handle = await App(router, broker, clock=clock).enqueue(show)
    await drain(router, broker, clock, worker_id="w-ctx")
    [ctx] = seen
    assert (ctx.id, ctx.task, ctx.queue, ctx.attempt, ctx.max_attempts, ctx.worker_id) == (
        handle.id,
        "ctx.show",
        "q1",
        1,
        4,
        "w-ctx",
    )


async def test_snooze_runs_again_later_without_using_an_attempt(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    calls = 0

    @router.task(name="upstream.call", max_attempts=1, keep_result=60)
    async def call() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise Snooze(30, "HTTP 429 from upstream")
        return "ok"

    handle = await App(router, broker, clock=clock).enqueue(call)
    for _ in range(2):
        await drain(router, broker, clock)
        info = await handle.info()
        assert info is not None and info.state is JobState.SCHEDULED and info.attempts == 0
        assert info.run_at == pytest.approx(clock.now() + 30)
        clock.advance(30)
    await drain(router, broker, clock)
    assert await handle.result(timeout=5) == "ok"
    info = await handle.info()
    assert info is not None and info.attempts == 1, "max_attempts=1 still allowed the real run"


async def test_retry_uses_an_attempt_with_its_own_delay(broker: Broker, clock: FakeClock) -> None:
    router = Router()

    @router.task(name="flaky.fetch", max_attempts=2)
    async def fetch() -> None:
        try:
            raise ConnectionError("reset by peer")
        except ConnectionError as exc:
            raise Retry(7) from exc

    handle = await App(router, broker, clock=clock).enqueue(fetch)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.SCHEDULED and info.attempts == 1
    assert info.run_at == pytest.approx(clock.now() + 7)
    assert info.last_error is not None and info.last_error.startswith(
        "ConnectionError: reset by peer"
    )
    clock.advance(7)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.DEAD and info.attempts == 2


async def test_enqueue_many_is_one_round_trip_and_all_or_nothing(
    broker: Broker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    router = Router()

    @router.task(name="many.add", keep_result=60)
    async def add(a: int, b: int) -> int:
        return a + b

    calls = 0
    original = broker.enqueue

    async def counting(jobs: Sequence[Job], now: float) -> list[str]:
        nonlocal calls
        calls += 1
        return await original(jobs, now)

    monkeypatch.setattr(broker, "enqueue", counting)
    app = App(router, broker, clock=clock)
    handles = await app.enqueue_many([add.call(i, i) for i in range(50)])
    assert calls == 1 and len({h.id for h in handles}) == 50
    with pytest.raises(ArgumentsInvalid, match="'b'"):
        await app.enqueue_many([add.call(1, 2), add.call(1, "two")])  # type: ignore[arg-type]
    assert calls == 1, "a refused call stores nothing"
    await drain(router, broker, clock)
    assert [await h.result(timeout=5) for h in handles[:3]] == [0, 2, 4]


async def test_waiting_for_a_result_times_out_and_a_dead_job_raises(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()

    @router.task(name="never.run", keep_result=60)
    async def never() -> None: ...

    @router.task(name="always.fails", max_attempts=1, keep_result=60)
    async def fails() -> None:
        raise KeyError("missing")

    app = App(router, broker, clock=clock)
    waiting = await app.enqueue(never.options(delay=3600))
    with pytest.raises(ResultTimeout, match=r"did not finish within 0\.2s"):
        await waiting.result(timeout=0.2)
    dead = await app.enqueue(fails)
    await drain(router, broker, clock)
    with pytest.raises(JobDead, match="KeyError: 'missing'") as err:
        await dead.result(timeout=5)
    assert err.value.error is not None and "gave up after 1 of 1" in err.value.error
