"""The worker's semantics on every broker: run, retry with backoff, dead letters, timeouts,
recovery of orphans, graceful shutdown. The clock is fake wherever time must pass; only timeouts
and the grace period use wall time, and they are bounded by fail_after."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from taskkit import Router, Worker, WorkerSettings
from taskkit.app import App
from taskkit.broker import Broker
from taskkit.clock import SystemClock
from taskkit.errors import EnqueueError
from taskkit.job import Job, JobState
from taskkit.middleware import Middleware
from taskkit.testing import FakeClock

pytestmark = pytest.mark.anyio

MakeBroker = Callable[[], Awaitable[Broker]]


async def drain(router: Router, broker: Broker, clock: Any, **settings: Any) -> Worker:
    """Run a burst worker until nothing is ready or running."""
    options: dict[str, Any] = {"burst": True, "poll_wait": 0.05, "grace_period": 1.0, **settings}
    worker = Worker(router, broker, WorkerSettings(**options), clock)
    with anyio.fail_after(20):
        await worker.run()
    return worker


async def test_handler_return_completes_the_job_and_keeps_its_result(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    threads: list[str] = []

    @router.task(keep_result=60)
    async def add(a: int, b: int) -> int:
        return a + b

    @router.task(name="mul", keep_result=60)
    def mul(a: int, b: int) -> int:
        threads.append(threading.current_thread().name)
        return a * b

    app = App(router, broker, clock=clock)
    h1 = await app.enqueue(add, 2, 3)
    h2 = await app.enqueue(mul, 4, b=5)
    await drain(router, broker, clock)
    assert await h1.result(timeout=5) == 5
    assert await h2.result(timeout=5) == 20
    assert threads and threads[0] != threading.main_thread().name, "plain functions run in threads"
    info = await h1.info()
    assert info is not None and info.state is JobState.DONE and info.attempts == 1


async def test_failures_follow_the_backoff_schedule_then_go_dead(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    runs: list[float] = []

    @router.task(max_attempts=3)
    async def flaky() -> None:
        runs.append(clock.now())
        raise ValueError("upstream said no")

    handle = await App(router, broker, clock=clock).enqueue(flaky)
    start = clock.now()
    for expected_delay in (5, 10):
        await drain(router, broker, clock)
        info = await handle.info()
        assert info is not None and info.state is JobState.SCHEDULED
        assert info.run_at == pytest.approx(clock.now() + expected_delay)
        assert info.last_error is not None and info.last_error.startswith(
            "ValueError: upstream said no"
        )
        clock.advance(expected_delay)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.DEAD and info.attempts == 3
    assert info.last_error is not None
    assert (
        "ValueError: upstream said no" in info.last_error and "gave up after 3" in info.last_error
    )
    assert 'File "' in info.last_error, "the traceback is kept"
    assert [r - start for r in runs] == [0, 5, 15]


async def test_an_error_marked_dead_on_skips_the_retries(broker: Broker, clock: FakeClock) -> None:
    router = Router()

    @router.task(max_attempts=5, dead_on=(PermissionError,))
    async def forbidden() -> None:
        raise PermissionError("no access")

    handle = await App(router, broker, clock=clock).enqueue(forbidden)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.DEAD and info.attempts == 1


async def test_a_hung_handler_is_cancelled_at_its_deadline_and_retried(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()

    @router.task(timeout=0.2, max_attempts=5)
    async def hung() -> None:
        await anyio.sleep(30)

    handle = await App(router, broker, clock=clock).enqueue(hung)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.SCHEDULED
    assert info.last_error is not None and info.last_error.startswith("JobTimeout")


async def test_an_unregistered_task_is_dead_at_once_with_the_reason(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()

    @router.task
    async def known() -> None: ...

    job_id = await broker.enqueue_raw("default", '{"task": "ai.check", "args": []}', clock.now())
    await drain(router, broker, clock)
    info = await broker.get_job(job_id, clock.now())
    assert info is not None and info.state is JobState.DEAD and info.attempts == 1
    assert info.last_error is not None and "UnknownTask" in info.last_error
    assert "ai.check" in info.last_error


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"args": []}', "task"),
        (b'{"task": "calc.add", "args": "x"}', "args"),
        (b"\xff\xfe{}", "UTF-8"),
        (b'{"task": "calc.add", "args": ["x", 1]}', "ArgumentsInvalid"),
        (b'{"task": "calc.add", "args": [1, 2, 3]}', "ArgumentsInvalid"),
        (b'{"task": "calc.add", "args": [1, 2], "pad": "' + b"x" * 10_000_000 + b'"}', "MiB limit"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (rb'{"task": "calc\u0007add\u0000", "args": [1, 2]}', "task name"),
    ],
    ids=[
        "malformed",
        "array",
        "no-task",
        "args-not-list",
        "not-utf8",
        "wrong-type",
        "too-many-args",
        "10MB",
        "deep-nesting",
        "control-chars",
    ],
)
async def test_bad_payloads_go_dead_with_a_reason_and_the_worker_keeps_going(
    broker: Broker, clock: FakeClock, payload: bytes, reason: str
) -> None:
    router = Router()

    @router.task(name="calc.add", keep_result=60)
    async def add(a: int, b: int) -> int:
        return a + b

    try:
        bad: str | None = await broker.enqueue_raw("default", payload, clock.now())
    except EnqueueError as exc:  # refusing at enqueue, with the reason, is the other option
        assert reason in str(exc)
        bad = None
    good = await App(router, broker, clock=clock).enqueue(add, 1, 2)
    await drain(router, broker, clock)
    if bad is not None:
        info = await broker.get_job(bad, clock.now())
        assert info is not None and info.state is JobState.DEAD and info.attempts == 1
        assert info.last_error is not None and reason in info.last_error
    assert await good.result(timeout=5) == 3


async def test_an_exception_whose_str_raises_is_still_recorded(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("str() is broken too")

    @router.task(name="nasty", max_attempts=1)
    async def nasty() -> None:
        raise Nasty()

    handle = await App(router, broker, clock=clock).enqueue(nasty)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.state is JobState.DEAD
    assert info.last_error is not None and info.last_error.startswith("Nasty: <str() of the")


async def test_a_foreign_minimal_payload_runs_with_the_defaults_filled(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    seen: list[Any] = []

    @router.task(name="emails.send")
    async def send(to: str, subject: str = "hi") -> None:
        seen.append((to, subject))

    await broker.enqueue_raw(
        "default", '{"task": "emails.send", "args": ["a@example.com"], "kwargs": {}}', clock.now()
    )
    await drain(router, broker, clock)
    assert seen == [("a@example.com", "hi")]


async def test_a_dead_workers_job_is_recovered_by_another_worker(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    router = Router()
    ran: list[int] = []

    @router.task(name="render", keep_result=60)
    async def render(n: int) -> int:
        ran.append(n)
        return n

    crashed, survivor = await make_broker(), await make_broker()
    handle = await App(router, crashed, clock=clock).enqueue(render, 7)
    await crashed.reserve(["default"], 1, 10, 0, clock.now())  # claimed, then the worker dies
    await crashed.close()
    clock.advance(11)
    await drain(router, survivor, clock, lease_for=10)  # start-up recovery, then the run
    info = await survivor.get_job(handle.id, clock.now())
    assert info is not None and info.state is JobState.DONE and info.attempts == 2
    assert ran == [7]


async def test_an_orphan_that_used_its_last_attempt_goes_dead(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    router = Router()

    @router.task(name="once", max_attempts=1)
    async def once() -> None: ...

    crashed, survivor = await make_broker(), await make_broker()
    handle = await App(router, crashed, clock=clock).enqueue(once)
    await crashed.reserve(["default"], 1, 10, 0, clock.now())
    clock.advance(11)
    await drain(router, survivor, clock, lease_for=10)
    info = await survivor.get_job(handle.id, clock.now())
    assert info is not None and info.state is JobState.DEAD
    assert info.last_error is not None and "LeaseExpired" in info.last_error


async def test_the_recovery_loop_reclaims_and_stops_when_told(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    """Seed 003's reaper: it takes back an orphan while it runs, and returns once stopped."""
    crashed, broker = await make_broker(), await make_broker()
    [orphan] = await crashed.enqueue([Job(task="nobody.runs.this", queue="other")], clock.now())
    await crashed.reserve(["other"], 1, 10, 0, clock.now())
    router = Router()
    claiming = anyio.Event()

    class FirstClaim(Middleware):
        def after_claim(self, worker: Worker, count: int, seconds: float) -> None:
            claiming.set()  # start-up recovery is over: what is reclaimed now, the loop did

    router.use(FirstClaim())

    @router.task(name="idle", queue="other")
    async def idle() -> None: ...

    settings = WorkerSettings(recovery_every=0.02, poll_wait=0.02, lease_for=10)
    worker = Worker(router, broker, settings, clock)
    finished = False

    async def run() -> None:
        nonlocal finished
        await worker.run()
        finished = True

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await claiming.wait()
            clock.advance(11)  # now the orphan's lease has run out: only the loop can see it
            while (info := await broker.get_job(orphan, clock.now())) is None or (
                info.state is not JobState.DEAD
            ):
                await anyio.sleep(0.02)
            worker.stop()
    assert finished and worker.stopping
    info = await broker.get_job(orphan, clock.now())
    assert info is not None and info.state is JobState.DEAD
    assert info.last_error is not None and "UnknownTask" in info.last_error


async def test_shutdown_hands_a_running_job_back_without_charging(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    started = anyio.Event()

    @router.task(name="long")
    async def long() -> None:
        started.set()
        await anyio.sleep(60)

    handle = await App(router, broker, clock=clock).enqueue(long)
    worker = Worker(router, broker, WorkerSettings(grace_period=0.1, poll_wait=0.05), clock)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await started.wait()
            worker.stop()
    info = await handle.info()
    assert info is not None and info.state is JobState.PENDING and info.attempts == 0


async def test_shutdown_lets_a_job_finish_within_the_grace_period(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()
    started = anyio.Event()

    @router.task(name="short", keep_result=60)
    async def short() -> str:
        started.set()
        await anyio.sleep(0.3)
        return "finished"

    handle = await App(router, broker, clock=clock).enqueue(short)
    worker = Worker(router, broker, WorkerSettings(grace_period=10, poll_wait=0.05), clock)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await started.wait()
            worker.stop()
    assert await handle.result(timeout=1) == "finished"


async def test_concurrency_is_bounded(broker: Broker, clock: FakeClock) -> None:
    router = Router()
    active, peak = 0, 0

    @router.task(name="slow")
    async def slow() -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await anyio.sleep(0.1)
        active -= 1

    app = App(router, broker, clock=clock)
    for _ in range(6):
        await app.enqueue(slow)
    worker = await drain(router, broker, clock, concurrency=2)
    assert peak == 2 and worker.processed == 6


async def test_heartbeats_keep_a_long_job_leased(make_broker: MakeBroker) -> None:
    """Wall-clock test: a 1.5 s job under a 0.6 s lease must never look expired to others."""
    router = Router()
    clock = SystemClock()
    started = anyio.Event()
    runs = 0

    @router.task(name="long")
    async def long() -> None:
        nonlocal runs
        runs += 1
        started.set()
        await anyio.sleep(1.5)

    broker, watcher = await make_broker(), await make_broker()
    await App(router, broker).enqueue(long)
    settings = WorkerSettings(lease_for=0.6, heartbeat_every=0.15, burst=True, poll_wait=0.05)
    stolen = []
    with anyio.fail_after(15):
        async with anyio.create_task_group() as tg:
            tg.start_soon(Worker(router, broker, settings, clock).run)
            await started.wait()
            for _ in range(12):
                stolen += await watcher.reclaim_expired(["default"], 10, 10, clock.now())
                await anyio.sleep(0.1)
    assert stolen == [] and runs == 1
