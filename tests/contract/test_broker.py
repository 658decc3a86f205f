"""The broker contract: what every broker must do, proven on every broker.

Time is a fake clock passed as ``now``; nothing here sleeps to let time pass. The seeds' tests
(seed 003: claim, race, dedupe, ownership, reaper, requeue; seed 000: crash between claim and ack)
each appear below under a name that says which behaviour they pin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import pytest

from taskkit.broker import Broker
from taskkit.job import Job, JobState, Lease
from taskkit.outcome import Complete, DeadLetter, Retry
from taskkit.testing import FakeClock

pytestmark = pytest.mark.anyio

MakeBroker = Callable[[], Awaitable[Broker]]
LEASE = 30.0


def job(task: str = "t.noop", **kw: object) -> Job:
    return Job(task=task, **kw)  # type: ignore[arg-type]


async def test_claim_moves_job_to_running_and_charges_an_attempt(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    [jid] = await broker.enqueue([job(args=[1, "a"], kwargs={"k": {"x": None}})], now)
    [d] = await broker.reserve(["default"], 10, LEASE, 0, now)
    assert d.job_id == jid
    assert d.attempts == 1
    assert d.lease_until == pytest.approx(now + LEASE)
    decoded = Job.model_validate_json(d.payload)
    assert decoded.args == [1, "a"] and decoded.kwargs == {"k": {"x": None}}
    info = await broker.get_job(jid, now)
    assert info is not None and info.state is JobState.RUNNING and info.attempts == 1


async def test_reserve_on_empty_queue_returns_nothing(broker: Broker, clock: FakeClock) -> None:
    assert await broker.reserve(["default"], 5, LEASE, 0, clock.now()) == []
    assert await broker.reserve(["default"], 5, LEASE, 0.05, clock.now()) == []


async def test_exactly_one_of_five_racing_claimers_wins(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    brokers = [await make_broker() for _ in range(5)]
    [jid] = await brokers[0].enqueue([job()], clock.now())
    results: list[list[object]] = []

    async def claim(b: Broker) -> None:
        results.append(list(await b.reserve(["default"], 1, LEASE, 0, clock.now())))

    async with anyio.create_task_group() as tg:
        for b in brokers:
            tg.start_soon(claim, b)
    winners = [r for r in results if r]
    assert len(winners) == 1, f"{len(winners)} claimers got the same job"
    assert winners[0][0].job_id == jid  # type: ignore[attr-defined]


async def test_concurrent_batch_claims_never_share_a_job(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    brokers = [await make_broker() for _ in range(4)]
    ids = await brokers[0].enqueue([job(args=[i]) for i in range(60)], clock.now())
    seen: list[str] = []

    async def drain(b: Broker) -> None:
        while got := await b.reserve(["default"], 7, LEASE, 0, clock.now()):
            seen.extend(d.job_id for d in got)

    async with anyio.create_task_group() as tg:
        for b in brokers:
            tg.start_soon(drain, b)
    assert sorted(seen) == sorted(ids)


async def test_reserve_honours_limit_priority_and_run_time(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    low_old = job(run_at=now - 10)
    low_new = job(run_at=now - 5)
    high = job(priority=5, run_at=now - 1)
    await broker.enqueue([low_new, low_old, high], now)
    first = await broker.reserve(["default"], 2, LEASE, 0, now)
    assert [d.job_id for d in first] == [high.id, low_old.id]
    second = await broker.reserve(["default"], 2, LEASE, 0, now)
    assert [d.job_id for d in second] == [low_new.id]


async def test_queues_listed_first_are_served_first(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    a, b = job(queue="a"), job(queue="b")
    await broker.enqueue([a, b], now)
    got = await broker.reserve(["b", "a"], 1, LEASE, 0, now)
    assert [d.job_id for d in got] == [b.id]
    assert await broker.reserve(["other"], 5, LEASE, 0, now) == []


async def test_scheduled_job_waits_for_its_run_time(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    [jid] = await broker.enqueue([job(run_at=now + 60)], now)
    assert await broker.reserve(["default"], 1, LEASE, 0, now) == []
    info = await broker.get_job(jid, now)
    assert info is not None and info.state is JobState.SCHEDULED
    stats = await broker.stats(now)
    assert (stats["default"].ready, stats["default"].scheduled) == (0, 1)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.advance(61))
    assert d.job_id == jid


async def test_waiting_reserve_wakes_when_a_job_arrives(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    consumer, producer = await make_broker(), await make_broker()
    got: list[str] = []

    async def consume() -> None:
        got.extend(d.job_id for d in await consumer.reserve(["default"], 1, LEASE, 10, clock.now()))

    with anyio.fail_after(9):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.2)
            [jid] = await producer.enqueue([job()], clock.now())
    assert got == [jid]


async def test_expired_lease_is_reclaimed_with_a_new_token(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    dead_worker, live_worker = await make_broker(), await make_broker()
    [jid] = await dead_worker.enqueue([job()], clock.now())
    [old] = await dead_worker.reserve(["default"], 1, 10, 0, clock.now())
    assert await live_worker.reclaim_expired(["default"], 10, 100, clock.advance(5)) == []
    [new] = await live_worker.reclaim_expired(["default"], 10, 100, clock.advance(6))
    assert new.job_id == jid and new.lease.token != old.lease.token
    assert new.attempts == 1, "reclaim must not charge a second attempt"
    # The old owner is fenced off: it can neither finish nor extend the job.
    assert await dead_worker.settle([(old.lease, Complete())], clock.now()) == [False]
    assert await dead_worker.extend([old.lease], 10, clock.now()) == [old.lease]
    # A second reclaimer does not get the same job.
    assert await dead_worker.reclaim_expired(["default"], 10, 100, clock.now()) == []


async def test_heartbeat_keeps_a_long_job_from_being_reclaimed(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    worker, other = await make_broker(), await make_broker()
    await worker.enqueue([job()], clock.now())
    [d] = await worker.reserve(["default"], 1, 10, 0, clock.now())
    assert await worker.extend([d.lease], 10, clock.advance(8)) == []
    assert await other.reclaim_expired(["default"], 10, 100, clock.advance(8)) == []
    assert await worker.settle([(d.lease, Complete())], clock.now()) == [True]


async def test_crash_between_claim_and_ack_loses_nothing(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    crashed = await make_broker()
    [jid] = await crashed.enqueue([job()], clock.now())
    await crashed.reserve(["default"], 1, 10, 0, clock.now())
    await crashed.close()  # the process is gone: no ack, no release
    restarted = await make_broker()
    assert await restarted.reserve(["default"], 1, 10, 0, clock.now()) == []
    [d] = await restarted.reclaim_expired(["default"], 10, 10, clock.advance(11))
    assert d.job_id == jid
    assert await restarted.settle(
        [(d.lease, Retry(clock.now(), "lease expired"))], clock.now()
    ) == [True]
    [again] = await restarted.reserve(["default"], 1, 10, 0, clock.now())
    assert again.job_id == jid and again.attempts == 2


async def test_settle_is_refused_without_ownership(broker: Broker, clock: FakeClock) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    forged = Lease(jid, "not-the-token", d.lease.queue)
    assert await broker.settle([(forged, Complete())], clock.now()) == [False]
    assert await broker.settle([(forged, DeadLetter("x"))], clock.now()) == [False]
    assert await broker.extend([forged], LEASE, clock.now()) == [forged]
    assert await broker.settle([(d.lease, Complete())], clock.now()) == [True]
    assert await broker.settle([(d.lease, Complete())], clock.now()) == [False], "completed twice"


async def test_settle_applies_a_mixed_batch(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    a, b, c = job(), job(), job()
    await broker.enqueue([a, b, c], now)
    ds = {d.job_id: d for d in await broker.reserve(["default"], 3, LEASE, 0, now)}
    applied = await broker.settle(
        [
            (ds[a.id].lease, Complete('{"ok": 1}', keep_until=now + 100)),
            (ds[b.id].lease, Retry(now + 50, "boom")),
            (ds[c.id].lease, DeadLetter("fatal")),
        ],
        now,
    )
    assert applied == [True, True, True]
    ia, ib, ic = [await broker.get_job(j.id, now) for j in (a, b, c)]
    assert ia is not None and ia.state is JobState.DONE and ia.result == '{"ok": 1}'
    assert ib is not None and ib.state is JobState.SCHEDULED and ib.last_error == "boom"
    assert ic is not None and ic.state is JobState.DEAD and ic.last_error == "fatal"


async def test_complete_without_keeping_the_result_leaves_no_active_job(
    broker: Broker, clock: FakeClock
) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    assert await broker.settle([(d.lease, Complete())], clock.now()) == [True]
    info = await broker.get_job(jid, clock.now())
    assert info is None or info.state is JobState.DONE
    stats = (await broker.stats(clock.now())).get("default")
    assert stats is None or (stats.ready, stats.running, stats.dead) == (0, 0, 0)


async def test_kept_result_expires(broker: Broker, clock: FakeClock) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    await broker.settle([(d.lease, Complete("42", keep_until=clock.now() + 60))], clock.now())
    info = await broker.get_job(jid, clock.advance(30))
    assert info is not None and info.result == "42"
    assert await broker.get_job(jid, clock.advance(31)) is None


async def test_retry_waits_for_its_time_and_keeps_the_error(
    broker: Broker, clock: FakeClock
) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    await broker.settle([(d.lease, Retry(clock.now() + 5, "ValueError: boom"))], clock.now())
    assert await broker.reserve(["default"], 1, LEASE, 0, clock.advance(4)) == []
    [again] = await broker.reserve(["default"], 1, LEASE, 0, clock.advance(1))
    assert again.job_id == jid and again.attempts == 2
    info = await broker.get_job(jid, clock.now())
    assert info is not None and info.last_error == "ValueError: boom"


async def test_retry_without_charge_gives_the_attempt_back(
    broker: Broker, clock: FakeClock
) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    await broker.settle([(d.lease, Retry(clock.now(), None, charge_attempt=False))], clock.now())
    [again] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    assert again.attempts == 1


async def test_release_hands_the_job_back_without_charging(
    broker: Broker, clock: FakeClock
) -> None:
    [jid] = await broker.enqueue([job()], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    await broker.release([d.lease], clock.now())
    info = await broker.get_job(jid, clock.now())
    assert info is not None and info.state is JobState.PENDING and info.attempts == 0
    [again] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    assert again.attempts == 1
    assert await broker.settle([(d.lease, Complete())], clock.now()) == [False]


async def test_dedupe_key_blocks_a_second_active_job(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    [first] = await broker.enqueue([job(dedupe_key="collect:1")], now)
    [second] = await broker.enqueue([job(dedupe_key="collect:1")], now)
    assert second == first
    [d] = await broker.reserve(["default"], 5, LEASE, 0, now)
    [while_running] = await broker.enqueue([job(dedupe_key="collect:1")], now)
    assert while_running == first
    assert await broker.reserve(["default"], 5, LEASE, 0, now) == []
    # Within one batch, too.
    x, y = await broker.enqueue([job(dedupe_key="k2"), job(dedupe_key="k2")], now)
    assert x == y


async def test_dedupe_key_frees_after_completion(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    [first] = await broker.enqueue([job(dedupe_key="collect:2")], now)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
    await broker.settle([(d.lease, Complete())], now)
    [second] = await broker.enqueue([job(dedupe_key="collect:2")], now)
    assert second != first


async def test_dedupe_key_frees_after_dead_letter(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    [first] = await broker.enqueue([job(dedupe_key="collect:3")], now)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
    await broker.settle([(d.lease, DeadLetter("fatal"))], now)
    [second] = await broker.enqueue([job(dedupe_key="collect:3")], now)
    assert second != first


async def test_dead_letters_are_listed_with_their_error(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    [jid] = await broker.enqueue([job("emails.send", queue="mail")], now)
    [d] = await broker.reserve(["mail"], 1, LEASE, 0, now)
    await broker.settle([(d.lease, DeadLetter("SMTPError: refused\nTraceback ..."))], now)
    [dead] = await broker.list_dead("mail", 10)
    assert (dead.id, dead.task, dead.queue, dead.attempts) == (jid, "emails.send", "mail", 1)
    assert dead.last_error is not None and "SMTPError" in dead.last_error
    assert await broker.list_dead("other", 10) == []
    assert (await broker.stats(now))["mail"].dead == 1


async def test_requeue_only_revives_dead_jobs_and_resets_attempts(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    dead_job, pending_job = job(), job()
    await broker.enqueue([dead_job], now)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
    await broker.settle([(d.lease, DeadLetter("fatal"))], now)
    await broker.enqueue([pending_job], now)
    assert await broker.requeue_dead([pending_job.id, dead_job.id], None, now) == [dead_job.id]
    info = await broker.get_job(dead_job.id, now)
    assert info is not None and info.state is JobState.PENDING and info.attempts == 0
    assert await broker.requeue_dead([dead_job.id], None, now) == [], (
        "a pending job is not requeued"
    )


async def test_requeue_all_and_purge_dead_by_queue(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    jobs = [job(queue="a"), job(queue="a"), job(queue="b")]
    await broker.enqueue(jobs, now)
    for q in ("a", "b"):
        for d in await broker.reserve([q], 5, LEASE, 0, now):
            await broker.settle([(d.lease, DeadLetter("x"))], now)
    assert sorted(await broker.requeue_dead(None, "a", now)) == sorted(j.id for j in jobs[:2])
    assert await broker.purge_dead(None, "b") == 1
    assert await broker.list_dead(None, 10) == []
    assert await broker.get_job(jobs[2].id, now) is None


async def test_paused_queue_accepts_jobs_but_is_not_served(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.set_paused("default", True)
    [jid] = await broker.enqueue([job()], now)
    assert await broker.reserve(["default"], 1, LEASE, 0, now) == []
    assert (await broker.stats(now))["default"].paused is True
    await broker.set_paused("default", False)
    [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
    assert d.job_id == jid


async def test_stats_count_every_state(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    await broker.enqueue([job(), job(), job(), job(run_at=now + 100)], now)
    [a, b] = await broker.reserve(["default"], 2, LEASE, 0, now)
    await broker.settle([(b.lease, DeadLetter("x"))], now)
    st = (await broker.stats(now))["default"]
    assert (st.ready, st.scheduled, st.running, st.dead, st.paused) == (1, 1, 1, 1, False)


async def test_foreign_payload_is_delivered_even_when_it_does_not_decode(
    broker: Broker, clock: FakeClock
) -> None:
    good = await broker.enqueue_raw("default", '{"task": "t.noop", "args": [1]}', clock.now())
    bad = await broker.enqueue_raw("default", b"{not json", clock.now())
    got = {d.job_id: d for d in await broker.reserve(["default"], 5, LEASE, 0, clock.now())}
    assert set(got) == {good, bad}
    assert Job.model_validate_json(got[good].payload).args == [1]
    await broker.settle([(got[bad].lease, DeadLetter("PayloadInvalid: not JSON"))], clock.now())
    [dead] = await broker.list_dead(None, 10)
    assert dead.id == bad and dead.task is None


async def test_enqueue_is_idempotent_by_id_while_the_broker_keeps_the_job(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    first = job()
    assert await broker.enqueue([first], now) == [first.id]
    assert await broker.enqueue([first, first], now) == [first.id, first.id]
    [d] = await broker.reserve(["default"], 5, LEASE, 0, now)
    assert await broker.enqueue([first], now) == [first.id], "running: not stored again"
    await broker.settle([(d.lease, Complete("1", keep_until=now + 60))], now)
    assert await broker.enqueue([first], now) == [first.id], "done and kept: not stored again"
    assert await broker.reserve(["default"], 5, LEASE, 0, now) == []
