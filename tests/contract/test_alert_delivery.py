"""Alert delivery on every broker: a worker POSTs the outbox to a real local HTTP server.

A webhook that fails first keeps the alert pending with its error and gets it on the next try;
a flood of dead jobs of one task is one message with a count; a key stays quiet for its window;
a queue nobody drains raises a stall alert. The clock is fake: the tests move it past backoffs
and windows instead of sleeping through them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from taskkit import App, Router, Worker, WorkerSettings
from taskkit.broker import Broker
from taskkit.job import Job
from taskkit.testing import FakeClock
from tests.servers import eventually
from tests.webhook import WebhookServer

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def running(
    router: Router, broker: Broker, clock: FakeClock, **kw: Any
) -> AsyncIterator[Worker]:
    settings = WorkerSettings(poll_wait=0.05, alert_every=0.02, grace_period=1, **kw)
    worker = Worker(router, broker, settings, clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        yield worker
        worker.stop()


def doomed_router() -> tuple[Router, Any, Any]:
    router = Router()

    @router.task(name="pay.charge", max_attempts=1)
    async def charge(n: int) -> None:
        raise RuntimeError(f"card {n} declined")

    @router.task(name="mail.send", max_attempts=1)
    async def send(n: int) -> None:
        raise RuntimeError("smtp down")

    return router, charge, send


async def dead_count(broker: Broker, clock: FakeClock) -> int:
    return sum(s.dead for s in (await broker.stats(clock.now())).values())


async def test_a_failing_webhook_keeps_the_alert_until_a_retry_delivers_it(
    broker: Broker, clock: FakeClock
) -> None:
    router, charge, _ = doomed_router()
    app = App(router, broker, clock=clock)
    with WebhookServer(fail_first=1) as hook:
        async with running(router, broker, clock, alert_webhook=hook.url, alert_window=600):
            for n in range(5):
                await app.enqueue(charge, n)
            await eventually(lambda: _all_dead(broker, clock, 5))
            await eventually(lambda: len(hook.received) == 1)
            await eventually(lambda: _failed_tries_are(broker, 1))
            [pending] = await broker.list_alerts(pending_only=True, limit=10)
            assert pending.key == "dead:default:pay.charge" and pending.count == 5
            assert "HTTP 503" in (pending.last_error or "")
            assert hook.accepted == []
            clock.advance(6)  # past the first delivery backoff (5 s)
            await eventually(lambda: len(hook.accepted) == 1)
            await anyio.sleep(0.2)  # several more loop turns: nothing else may be sent
    [body] = hook.accepted
    assert body["alert"]["count"] == 5 and body["alert"]["task"] == "pay.charge"
    assert body["alert"]["kind"] == "dead" and "declined" in body["alert"]["detail"]
    assert body["text"].startswith("taskkit: job ") and "(5 events)" in body["text"]
    assert await broker.list_alerts(pending_only=True, limit=10) == []


async def _all_dead(broker: Broker, clock: FakeClock, n: int) -> bool:
    return await dead_count(broker, clock) == n


async def _failed_tries_are(broker: Broker, n: int) -> bool:
    return sum(a.attempts for a in await broker.list_alerts(pending_only=True, limit=10)) == n


async def test_one_message_per_key_per_window(broker: Broker, clock: FakeClock) -> None:
    router, charge, send = doomed_router()
    app = App(router, broker, clock=clock)
    with WebhookServer() as hook:
        async with running(router, broker, clock, alert_webhook=hook.url, alert_window=600):
            await app.enqueue(charge, 1)
            await eventually(lambda: len(hook.accepted) == 1)
            # Inside the window: more of the same key wait, another key goes out at once.
            for n in range(3):
                await app.enqueue(charge, n)
            await app.enqueue(send, 1)
            await eventually(lambda: len(hook.accepted) == 2)
            await eventually(lambda: _all_dead(broker, clock, 5))
            await anyio.sleep(0.2)
            assert [b["alert"]["key"] for b in hook.accepted] == [
                "dead:default:pay.charge",
                "dead:default:mail.send",
            ]
            [waiting] = await broker.list_alerts(pending_only=True, limit=10)
            assert (waiting.key, waiting.count) == ("dead:default:pay.charge", 3)
            clock.advance(601)  # the window ends: the three go out as one message
            await eventually(lambda: len(hook.accepted) == 3)
    assert hook.accepted[2]["alert"]["count"] == 3
    assert len(hook.received) == 3


async def test_a_queue_nobody_drains_raises_a_stall_alert(broker: Broker, clock: FakeClock) -> None:
    router = Router()

    @router.task(name="t.ok")
    async def ok() -> None:
        return None

    app = App(router, broker, clock=clock)
    await app.enqueue(ok.options(queue="orphaned"))
    await app.enqueue(ok.options(queue="held"))
    await broker.set_paused("held", True)
    with WebhookServer() as hook:
        async with running(
            router, broker, clock, queues=["default"], alert_webhook=hook.url, stall_after=60
        ):
            await anyio.sleep(0.1)
            assert hook.received == []  # not stalled yet
            clock.advance(61)
            await eventually(lambda: len(hook.accepted) == 1)
            await anyio.sleep(0.2)
    [body] = hook.accepted
    assert body["alert"]["key"] == "stall:orphaned"  # the paused queue is stalled on purpose
    assert body["alert"]["kind"] == "stall" and "waited 61s" in body["alert"]["detail"]
    assert body["text"] == f"taskkit: queue orphaned is stalled: {body['alert']['detail']}"


async def test_stalls_are_recorded_without_a_webhook(broker: Broker, clock: FakeClock) -> None:
    router = Router()
    app = App(router, broker, clock=clock)
    await app.enqueue_jobs([Job(task="t.any", queue="orphaned")])
    async with running(router, broker, clock, queues=["default"], stall_after=30):
        clock.advance(31)
        await eventually(lambda: _alert_keys(broker))
    assert await _alert_keys(broker) == ["stall:orphaned"]


async def _alert_keys(broker: Broker) -> list[str]:
    return [a.key for a in await broker.list_alerts(pending_only=True, limit=10)]
