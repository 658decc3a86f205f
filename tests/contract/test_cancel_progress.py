"""Cancel, progress and status on every broker (issue: producer and results API)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import anyio
import pytest

from taskkit import App, JobDead, JobProgress, LeaseLost, Router, current_job, report_progress
from taskkit.broker import Broker
from taskkit.job import Job, JobState
from taskkit.outcome import Complete, Retry
from taskkit.testing import FakeClock

from .test_worker import drain

pytestmark = pytest.mark.anyio

MakeBroker = Callable[[], Awaitable[Broker]]
LEASE = 30.0


async def test_cancel_a_pending_or_scheduled_job(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    ready, later = Job(task="t", dedupe_key="k"), Job(task="t", run_at=now + 60)
    await broker.enqueue([ready, later], now)
    assert await broker.cancel(ready.id, now + 100, now) is JobState.CANCELLED
    assert await broker.cancel(later.id, now + 100, now) is JobState.CANCELLED
    assert await broker.cancel(ready.id, now + 100, now) is JobState.CANCELLED, "idempotent"
    assert await broker.reserve(["default"], 5, LEASE, 0, clock.advance(61)) == []
    info = await broker.get_job(ready.id, clock.now())
    assert info is not None and info.state is JobState.CANCELLED
    [again] = await broker.enqueue([Job(task="t", dedupe_key="k")], clock.now())
    assert again != ready.id, "the dedupe key is free again"
    stats = (await broker.stats(clock.now())).get("default")
    assert stats is not None and (stats.ready, stats.scheduled) == (1, 0)
    assert await broker.get_job(ready.id, clock.advance(40)) is None, "kept until keep_until"


async def test_cancel_does_not_touch_running_or_finished_jobs(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    running, done = Job(task="t"), Job(task="t")
    await broker.enqueue([running, done], now)
    got = {d.job_id: d for d in await broker.reserve(["default"], 2, LEASE, 0, now)}
    await broker.settle([(got[done.id].lease, Complete("1", keep_until=now + 60))], now)
    assert await broker.cancel(running.id, now + 100, now) is JobState.RUNNING
    assert await broker.cancel(done.id, now + 100, now) is JobState.DONE
    assert await broker.cancel("0" * 32, now + 100, now) is None
    assert await broker.settle([(got[running.id].lease, Complete())], now) == [True]


async def test_progress_is_fenced_and_reset_by_a_new_attempt(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    old_worker, new_worker = await make_broker(), await make_broker()
    [jid] = await old_worker.enqueue([Job(task="t")], clock.now())
    [old] = await old_worker.reserve(["default"], 1, 10, 0, clock.now())
    assert await old_worker.set_progress(old.lease, '{"step": 1}', clock.now()) is True
    info = await old_worker.get_job(jid, clock.now())
    assert info is not None and info.progress == '{"step": 1}'
    assert info.started_at == pytest.approx(clock.now())
    [taken] = await new_worker.reclaim_expired(["default"], 10, 10, clock.advance(11))
    await new_worker.settle([(taken.lease, Retry(clock.now(), "lease expired"))], clock.now())
    [new] = await new_worker.reserve(["default"], 1, 10, 0, clock.now())
    info = await new_worker.get_job(jid, clock.now())
    assert info is not None and info.progress is None, "a new attempt starts without progress"
    assert await old_worker.set_progress(old.lease, '{"step": 2}', clock.now()) is False
    assert await new_worker.set_progress(new.lease, '{"step": 0}', clock.now()) is True


async def test_job_progress_steps_from_a_task(broker: Broker, clock: FakeClock) -> None:
    router = Router()
    snapshots: list[object] = []

    @router.task(name="build.site", max_attempts=2)
    async def build() -> None:
        progress = JobProgress(["prepare", "generate"])
        async with progress.step("prepare"):
            pass
        info = await broker.get_job(current_job().id, clock.now())
        assert info is not None and info.progress is not None
        snapshots.append(json.loads(info.progress))
        async with progress.step("generate"):
            if current_job().attempt == 1:
                raise ValueError("upstream failed")

    @router.task(name="plain.steps", keep_result=60)
    def plain() -> str:
        progress = JobProgress(["only"])
        with progress.step_sync("only"):
            pass
        return "ok"

    app = App(router, broker, clock=clock)
    handle = await app.enqueue(build)
    plain_handle = await app.enqueue(plain)
    await drain(router, broker, clock)
    info = await handle.info()
    assert info is not None and info.progress is not None
    failed = json.loads(info.progress)
    assert failed["attempt"] == 1
    assert [s["status"] for s in failed["steps"]] == ["done", "failed"]
    clock.advance(5)
    await drain(router, broker, clock)
    assert snapshots[1] == {
        "attempt": 2,
        "steps": [{"name": "prepare", "status": "done"}, {"name": "generate", "status": "pending"}],
    }
    assert await plain_handle.result(timeout=5) == "ok"
    plain_info = await plain_handle.info()
    assert plain_info is not None and plain_info.progress is not None
    assert json.loads(plain_info.progress)["steps"] == [{"name": "only", "status": "done"}]


async def test_a_worker_that_lost_the_job_cannot_report_progress(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    router = Router()
    outcome: list[object] = []
    thief = await make_broker()

    @router.task(name="slow.steps", max_attempts=5)
    async def slow() -> None:
        # Simulate the lease running out under us: another worker reclaims the job.
        taken = await thief.reclaim_expired(["default"], 10, 10, clock.advance(100))
        assert len(taken) == 1
        outcome.append(await report_progress({"late": True}))
        try:
            async with JobProgress(["x"]).step("x"):
                pass
        except LeaseLost as exc:
            outcome.append(type(exc).__name__)
        await thief.settle([(taken[0].lease, Complete())], clock.now())

    broker = await make_broker()
    await App(router, broker, clock=clock).enqueue(slow)
    await drain(router, broker, clock, lease_for=10)
    assert outcome == [False, "LeaseLost"]


async def test_cancel_through_the_app_and_waiting_on_a_cancelled_job(
    broker: Broker, clock: FakeClock
) -> None:
    router = Router()

    @router.task(name="to.cancel")
    async def job() -> None: ...

    app = App(router, broker, clock=clock)
    handle = await app.enqueue(job.options(delay=60))
    assert await handle.cancel() is JobState.CANCELLED
    with pytest.raises(JobDead, match="cancelled"), anyio.fail_after(5):
        await handle.result(timeout=2)
