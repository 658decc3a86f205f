"""The alert outbox, on every broker: a dead job records an alert in the same step, alerts of
one key merge, delivery is claimed under a lease, and a failed delivery stays pending.

These pin the broker half (seed 003's alert row and outbox); tests/contract/test_alert_delivery.py
drives a worker that posts them to a real local HTTP server.
"""

from __future__ import annotations

import pytest

from taskkit.broker import Broker
from taskkit.job import AlertEvent, Job, dead_alert_key
from taskkit.outcome import DeadLetter
from taskkit.testing import FakeClock
from tests.contract.test_broker import MakeBroker

pytestmark = pytest.mark.anyio
LEASE = 30.0


def event(key: str = "stall:default", detail: str = "waited 90 s") -> AlertEvent:
    return AlertEvent(key=key, kind="stall", queue="default", task=None, job_id=None, detail=detail)


async def kill(broker: Broker, now: float, task: str = "t.boom", error: str = "E: boom") -> str:
    [jid] = await broker.enqueue([Job(task=task)], now)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
    assert await broker.settle([(d.lease, DeadLetter(error))], now) == [True]
    return jid


async def test_a_dead_job_records_a_pending_alert_in_the_same_step(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    jid = await kill(broker, now, error="ValueError: bad\nTraceback ...")
    [alert] = await broker.list_alerts(pending_only=True, limit=10)
    assert alert.key == dead_alert_key("default", "t.boom") == "dead:default:t.boom"
    assert (alert.kind, alert.queue, alert.task, alert.job_id) == ("dead", "default", "t.boom", jid)
    assert alert.detail.startswith("ValueError: bad")
    assert (alert.count, alert.attempts, alert.sent_at) == (1, 0, None)
    assert alert.first_at == alert.last_at == alert.next_at == pytest.approx(now)


async def test_a_flood_of_dead_jobs_of_one_task_is_one_alert_with_a_count(
    broker: Broker, clock: FakeClock
) -> None:
    ids = [await kill(broker, clock.now()) for _ in range(5)]
    await kill(broker, clock.now(), task="t.other")
    alerts = {a.key: a for a in await broker.list_alerts(pending_only=True, limit=10)}
    assert set(alerts) == {"dead:default:t.boom", "dead:default:t.other"}
    assert alerts["dead:default:t.boom"].count == 5
    assert alerts["dead:default:t.boom"].job_id == ids[-1]  # the latest event's


async def test_a_refused_dead_letter_records_no_alert(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    await broker.enqueue([Job(task="t.boom")], now)
    [d] = await broker.reserve(["default"], 1, 1.0, 0, now)
    [taken] = await broker.reclaim_expired(["default"], LEASE, 10, now + 5)
    assert await broker.settle([(d.lease, DeadLetter("E: late"))], now + 5) == [False]
    assert await broker.list_alerts(pending_only=False, limit=10) == []
    assert taken.job_id == d.job_id


async def test_a_long_error_is_cut_to_the_detail_limit(broker: Broker, clock: FakeClock) -> None:
    await kill(broker, clock.now(), error="x" * 20_000)
    [alert] = await broker.list_alerts(pending_only=True, limit=10)
    assert 100 <= len(alert.detail) <= 4000


async def test_claimed_alerts_are_leased_to_one_caller(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    a, b = await make_broker(), await make_broker()
    now = clock.now()
    await a.record_alert(event(), now)
    [claimed] = await a.claim_alerts(10, LEASE, now)
    assert claimed.token and claimed.count == 1
    assert await b.claim_alerts(10, LEASE, now + 1) == []
    # The lease runs out (the deliverer died): another caller gets it, the first is fenced off.
    [again] = await b.claim_alerts(10, LEASE, now + LEASE + 1)
    assert again.token != claimed.token
    assert not await a.finish_alert(claimed, True, now + 100, None, now + LEASE + 2)
    assert await b.finish_alert(again, True, now + 100, None, now + LEASE + 2)
    assert await a.list_alerts(pending_only=True, limit=10) == []


async def test_a_delivered_alert_is_quiet_until_its_window_ends(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.record_alert(event(detail="first"), now)
    [claimed] = await broker.claim_alerts(10, LEASE, now)
    assert await broker.finish_alert(claimed, True, now + 600, None, now + 1)
    [row] = await broker.list_alerts(pending_only=False, limit=10)
    assert (row.count, row.sent_at, row.token) == (0, pytest.approx(now + 1), None)
    # More events inside the window merge and wait for the window's end.
    await broker.record_alert(event(detail="second"), now + 10)
    await broker.record_alert(event(detail="third"), now + 20)
    assert await broker.claim_alerts(10, LEASE, now + 599) == []
    [pending] = await broker.list_alerts(pending_only=True, limit=10)
    assert (pending.count, pending.detail) == (2, "third")
    assert pending.first_at == pytest.approx(now + 10)
    [later] = await broker.claim_alerts(10, LEASE, now + 600)
    assert later.count == 2


async def test_events_recorded_during_delivery_stay_pending(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.record_alert(event(), now)
    [claimed] = await broker.claim_alerts(10, LEASE, now)
    await broker.record_alert(event(), now + 1)  # arrives while the webhook call is in flight
    assert await broker.finish_alert(claimed, True, now + 2, None, now + 2)
    [pending] = await broker.list_alerts(pending_only=True, limit=10)
    assert pending.count == 1
    [next_one] = await broker.claim_alerts(10, LEASE, now + 2)
    assert next_one.count == 1


async def test_a_failed_delivery_stays_pending_and_backs_off(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.record_alert(event(), now)
    [claimed] = await broker.claim_alerts(10, LEASE, now)
    assert await broker.finish_alert(claimed, False, now + 5, "HTTP 503", now + 1)
    [row] = await broker.list_alerts(pending_only=True, limit=10)
    assert (row.count, row.attempts, row.last_error, row.sent_at) == (1, 1, "HTTP 503", None)
    assert row.next_at == pytest.approx(now + 5)
    assert await broker.claim_alerts(10, LEASE, now + 4) == []
    [retry] = await broker.claim_alerts(10, LEASE, now + 5)
    assert retry.attempts == 1
    assert await broker.finish_alert(retry, False, now + 20, "HTTP 503", now + 6)
    [row] = await broker.list_alerts(pending_only=True, limit=10)
    assert row.attempts == 2


async def test_claim_alerts_takes_the_earliest_due_first_up_to_the_limit(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    for i in range(3):
        await broker.record_alert(event(key=f"stall:q{i}"), now + i)
    first = await broker.claim_alerts(2, LEASE, now + 10)
    assert [a.key for a in first] == ["stall:q0", "stall:q1"]
    [last] = await broker.claim_alerts(2, LEASE, now + 10)
    assert last.key == "stall:q2"


async def test_alerts_survive_a_new_broker_instance(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    a = await make_broker()
    await kill(a, clock.now())
    await a.close()
    b = await make_broker()
    [alert] = await b.list_alerts(pending_only=True, limit=10)
    assert alert.key == "dead:default:t.boom"


async def test_stats_say_when_the_oldest_ready_job_became_due(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.enqueue([Job(task="t.a", queue="slow")], now)
    await broker.enqueue([Job(task="t.b", queue="slow")], now + 5)
    await broker.enqueue([Job(task="t.c", queue="slow", run_at=now + 100)], now + 5)
    stats = await broker.stats(now + 10)
    assert stats["slow"].oldest_ready_at == pytest.approx(now)
    [d] = await broker.reserve(["slow"], 1, LEASE, 0, now + 10)
    await broker.settle([(d.lease, DeadLetter("E"))], now + 10)
    assert (await broker.stats(now + 10))["slow"].oldest_ready_at == pytest.approx(now + 5)
    await broker.reserve(["slow"], 1, LEASE, 0, now + 10)
    assert (await broker.stats(now + 10))["slow"].oldest_ready_at is None
    # A delayed job counts from its run time, not from when it was enqueued.
    assert (await broker.stats(now + 150))["slow"].oldest_ready_at == pytest.approx(now + 100)
