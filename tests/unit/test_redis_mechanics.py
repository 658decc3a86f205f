"""Mechanics of the Redis broker beyond the contract: script reloading, dead-letter retention,
real TTLs, the BLMOVE wait (several queues, scheduled jobs, resume), batching corner cases, where
alert rows and flow-control keys live, and how stats dates what is ready.
Each runs on the real server and on fakeredis."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from redis import exceptions as rex

from brokers.redis import QueueKeys, RedisBroker
from taskkit.errors import BrokerUnavailable
from taskkit.job import ALERT_DETAIL_LIMIT, AlertEvent, Job, JobState, Lease, peek_task
from taskkit.outcome import Complete, DeadLetter, Outcome
from taskkit.testing import FakeClock
from tests import servers
from tests.backends import BrokerSpace
from tests.backends import redis as backend

pytestmark = pytest.mark.anyio
LEASE = 30.0


@pytest.fixture(params=backend.NAMES)
async def space(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    if request.param == "redis":
        servers.ensure_redis()
    prefix = backend.unique_prefix(request.node.name)
    async with backend.space(prefix, tmp_path, request.param) as sp:
        yield sp


@pytest.fixture
async def broker(space: BrokerSpace) -> AsyncIterator[RedisBroker]:
    b = space.make()
    assert isinstance(b, RedisBroker)
    await b.connect()
    yield b
    await b.close()


async def test_scripts_are_reloaded_after_the_server_forgets_them(
    broker: RedisBroker, clock: FakeClock
) -> None:
    await backend.cmd(broker.client, "SCRIPT", "FLUSH")
    await broker.enqueue([Job(task="t.a"), Job(task="t.b", queue="other")], clock.now())
    got = await broker.reserve(["default", "other"], 5, LEASE, 0, clock.now())
    await backend.cmd(broker.client, "SCRIPT", "FLUSH")
    # Two queues: two script calls in one pipeline, both NOSCRIPT, both redone.
    assert await broker.settle([(d.lease, Complete()) for d in got], clock.now()) == [True, True]


async def test_dead_letters_are_trimmed_by_count_and_age(
    space: BrokerSpace, clock: FakeClock
) -> None:
    b = space.make()
    assert isinstance(b, RedisBroker)
    b.dead_max, b.dead_ttl = 3, 100.0
    await b.connect()
    await b.enqueue([Job(task="t.x", args=[i]) for i in range(5)], clock.now())
    for d in await b.reserve(["default"], 5, LEASE, 0, clock.now()):
        clock.advance(1)
        await b.settle([(d.lease, DeadLetter("x"))], clock.now())
    dead = await b.list_dead("default", 10)
    assert len(dead) == 3, "only the newest dead_max are kept"
    k = b.keys("default")
    assert await backend.cmd(b.client, "HLEN", k.payloads) == 3, "trimmed jobs leave nothing"
    # Age: once one more job dies 100 s later, the old ones are past dead_ttl.
    await b.enqueue([Job(task="t.y")], clock.now())
    [d] = await b.reserve(["default"], 1, LEASE, 0, clock.now())
    await b.settle([(d.lease, DeadLetter("late"))], clock.advance(150))
    assert [i.last_error for i in await b.list_dead("default", 10)] == ["late"]
    await b.close()


async def test_a_kept_result_has_a_real_ttl(broker: RedisBroker, clock: FakeClock) -> None:
    [jid] = await broker.enqueue([Job(task="t.x")], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    await broker.settle([(d.lease, Complete("1", keep_until=clock.now() + 120))], clock.now())
    pttl = await backend.cmd(broker.client, "PTTL", broker.keys("default").done(jid))
    assert 110_000 < pttl <= 120_000
    k = broker.keys("default")
    for key in (k.payloads, k.meta, k.attempts, k.tokens):
        assert await backend.cmd(broker.client, "HLEN", key) == 0


async def test_a_wait_on_several_queues_wakes_for_any_of_them(
    space: BrokerSpace, broker: RedisBroker, clock: FakeClock
) -> None:
    producer = space.make()
    await producer.connect()

    async def produce() -> None:
        await anyio.sleep(0.3)
        await producer.enqueue([Job(task="t.x", queue="c")], clock.now())

    started = time.monotonic()
    with anyio.fail_after(8):
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            got = await broker.reserve(["a", "b", "c"], 5, LEASE, 6, clock.now())
    assert [d.lease.queue for d in got] == ["c"] and time.monotonic() - started < 4
    # The cancelled waits left the broker usable, and nothing stranded in processing lists.
    await producer.enqueue([Job(task="t.y", queue="a")], clock.now())
    assert len(await broker.reserve(["a", "b", "c"], 5, LEASE, 1, clock.now())) == 1
    for q in "abc":
        processing = broker.keys(q).processing(broker.broker_id)
        assert await backend.cmd(broker.client, "LLEN", processing) == 0
    await producer.close()


async def test_the_wait_ends_when_a_scheduled_job_falls_due(broker: RedisBroker) -> None:
    now = time.time()
    [jid] = await broker.enqueue([Job(task="t.x", run_at=now + 0.4)], now)
    started = time.monotonic()
    got = await broker.reserve(["default"], 1, LEASE, 8, now)
    assert [d.job_id for d in got] == [jid] and time.monotonic() - started < 4
    assert got[0].lease_until >= now + 0.4 + LEASE - 0.01, "now moves on with the wait"


async def test_resuming_a_queue_wakes_a_waiting_worker(
    space: BrokerSpace, broker: RedisBroker, clock: FakeClock
) -> None:
    admin = space.make()
    await admin.connect()
    await admin.set_paused("default", True)
    [jid] = await admin.enqueue([Job(task="t.x")], clock.now())

    async def resume() -> None:
        await anyio.sleep(0.4)
        await admin.set_paused("default", False)

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        got = await broker.reserve(["default"], 1, LEASE, 8, clock.now())
    assert [d.job_id for d in got] == [jid] and time.monotonic() - started < 4
    await admin.close()


async def test_a_raw_payload_that_looks_like_a_wake_hint_is_still_delivered(
    broker: RedisBroker, clock: FakeClock
) -> None:
    jid = await broker.enqueue_raw("default", "0123456789abcdef0123456789abcdef", clock.now())
    [d] = await broker.reserve(["default"], 5, LEASE, 0, clock.now())
    assert d.job_id == jid and d.payload == b"0123456789abcdef0123456789abcdef"


async def test_identical_raw_payloads_each_keep_their_promised_id(
    broker: RedisBroker, clock: FakeClock
) -> None:
    ids = [await broker.enqueue_raw("default", '{"task": "t.same"}', clock.now()) for _ in range(3)]
    got = await broker.reserve(["default"], 5, LEASE, 0, clock.now())
    assert sorted(d.job_id for d in got) == sorted(ids)
    assert await backend.cmd(broker.client, "HLEN", broker.keys("default").rawids) == 0


async def test_reclaim_from_many_workers_at_once_hands_each_job_to_one(
    space: BrokerSpace, clock: FakeClock
) -> None:
    brokers = []
    for _ in range(5):
        b = space.make()
        await b.connect()
        brokers.append(b)
    ids = await brokers[0].enqueue([Job(task="t.x", args=[i]) for i in range(20)], clock.now())
    await brokers[0].reserve(["default"], 20, 10, 0, clock.now())
    clock.advance(11)
    taken: list[str] = []

    async def reclaim(b: RedisBroker) -> None:
        taken.extend(d.job_id for d in await b.reclaim_expired(["default"], 10, 7, clock.now()))

    async with anyio.create_task_group() as tg:
        for b in brokers:
            tg.start_soon(reclaim, b)  # type: ignore[arg-type]
    assert sorted(taken) == sorted(ids)
    for b in brokers:
        await b.close()


async def test_one_lease_twice_in_a_settle_batch_applies_once(
    broker: RedisBroker, clock: FakeClock
) -> None:
    await broker.enqueue([Job(task="t.x")], clock.now())
    [d] = await broker.reserve(["default"], 1, LEASE, 0, clock.now())
    pairs: list[tuple[Lease, Outcome]] = [(d.lease, Complete()), (d.lease, DeadLetter("x"))]
    assert await broker.settle(pairs, clock.now()) == [True, False]


async def test_enqueue_with_an_id_that_is_already_pending_stores_nothing_new(
    broker: RedisBroker, clock: FakeClock
) -> None:
    first = Job(task="t.x", id="order-17")
    assert await broker.enqueue([first], clock.now()) == ["order-17"]
    assert await broker.enqueue([Job(task="t.other", id="order-17")], clock.now()) == ["order-17"]
    [d] = await broker.reserve(["default"], 5, LEASE, 0, clock.now())
    assert d.job_id == "order-17" and Job.model_validate_json(d.payload).task == "t.x"
    assert await broker.reserve(["default"], 5, LEASE, 0, clock.now()) == []


async def test_wake_hints_do_not_pile_up(broker: RedisBroker, clock: FakeClock) -> None:
    for _ in range(5):
        await broker.enqueue([Job(task="t.x") for _ in range(100)], clock.now())
    ready = broker.keys("default").ready
    assert await backend.cmd(broker.client, "LLEN", ready) <= 5 * 64
    while got := await broker.reserve(["default"], 50, LEASE, 0, clock.now()):
        await broker.settle([(d.lease, Complete()) for d in got], clock.now())
    assert await backend.cmd(broker.client, "LLEN", ready) == 0
    st = (await broker.stats(clock.now()))["default"]
    assert (st.ready, st.running) == (0, 0)


async def test_stats_count_foreign_payloads_not_yet_adopted(
    broker: RedisBroker, clock: FakeClock
) -> None:
    await backend.cmd(broker.client, "LPUSH", broker.keys("q").ready, '{"task": "t.x"}')
    await backend.cmd(broker.client, "SADD", f"{broker.prefix}:queues", "q")
    assert (await broker.stats(clock.now()))["q"].ready == 1


async def test_get_job_finds_a_job_enqueued_by_another_instance(
    space: BrokerSpace, broker: RedisBroker, clock: FakeClock
) -> None:
    other = space.make()
    await other.connect()
    [jid] = await other.enqueue([Job(task="t.x", queue="far", run_at=clock.now() + 9)], clock.now())
    info = await broker.get_job(jid, clock.now())
    assert info is not None and info.queue == "far" and info.state is JobState.SCHEDULED
    assert await broker.get_job("no-such-id", clock.now()) is None
    await other.close()


async def test_claims_and_reclaims_bigger_than_one_script_batch(
    broker: RedisBroker, clock: FakeClock
) -> None:
    ids = await broker.enqueue([Job(task="t.x", args=[i]) for i in range(1200)], clock.now())
    got = await broker.reserve(["default"], 1100, 10, 0, clock.now())
    assert len(got) == 1100 and len({d.job_id for d in got}) == 1100
    back = await broker.reclaim_expired(["default"], 10, 1150, clock.advance(11))
    assert len(back) == 1100 and {d.job_id for d in back} == {d.job_id for d in got}
    rest = await broker.reserve(["default"], 1100, 10, 0, clock.now())
    assert {d.job_id for d in [*got, *rest]} == set(ids)


async def test_a_cancelled_job_leaves_only_its_kept_record(
    broker: RedisBroker, clock: FakeClock
) -> None:
    [jid] = await broker.enqueue([Job(task="t.x", dedupe_key="k")], clock.now())
    assert await broker.cancel(jid, clock.now() + 30, clock.now()) is JobState.CANCELLED
    k = broker.keys("default")
    for key in (k.payloads, k.meta, k.attempts, k.dedupe):
        assert await backend.cmd(broker.client, "HLEN", key) == 0
    assert await backend.cmd(broker.client, "ZCARD", k.queued) == 0
    assert 20_000 < await backend.cmd(broker.client, "PTTL", k.done(jid)) <= 30_000
    assert await broker.enqueue([Job(task="t.x", id=jid)], clock.now()) == [jid], "id is known"
    assert await broker.cancel(jid, clock.now() + 30, clock.advance(31)) is None


@pytest.mark.parametrize("error", [rex.ConnectionError("gone"), ConnectionResetError(104, "reset")])
async def test_a_lost_connection_is_broker_unavailable_and_queues_are_registered_again(
    broker: RedisBroker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    await broker.reserve(["default", "other"], 1, LEASE, 0, clock.now())
    registry = f"{broker.prefix}:queues"
    # A restart without persistence: the registry is gone, and the next call loses its socket.
    await backend.cmd(broker.client, "DEL", registry)
    blmove = broker._blmove

    async def fail(k: QueueKeys, timeout: float) -> None:
        raise error

    monkeypatch.setattr(broker, "_blmove", fail)
    for queues in (["default"], ["default", "other"]):  # one BLMOVE, and several at once
        with pytest.raises(BrokerUnavailable) as caught:
            await broker.reserve(queues, 1, LEASE, 1, clock.now())
        assert "unavailable" in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.setattr(broker, "_blmove", blmove)
    assert await broker.reserve(["default", "other"], 1, LEASE, 0, clock.now()) == []
    members = await backend.cmd(broker.client, "SMEMBERS", registry)
    assert sorted(members) == [b"default", b"other"]


# -- the alert outbox ----------------------------------------------------------------------------


async def _kill(
    broker: RedisBroker, now: float, queue: str, payload: str | bytes, error: str
) -> str:
    jid = await broker.enqueue_raw(queue, payload, now)
    [d] = await broker.reserve([queue], 1, LEASE, 0, now)
    assert d.job_id == jid
    assert await broker.settle([(d.lease, DeadLetter(error))], now) == [True]
    return jid


async def test_an_alert_row_lives_with_its_queue_and_outlives_its_delivery(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    await _kill(broker, now, "mail", '{"task": "t.send"}', "E: boom")
    k = broker.keys("mail")
    assert await backend.cmd(broker.client, "HKEYS", k.alerts) == [b"dead:mail:t.send"]
    assert await backend.cmd(broker.client, "PTTL", k.alerts) == -1, "no TTL on alert rows"
    score = await backend.cmd(broker.client, "ZSCORE", k.alertdue, "dead:mail:t.send")
    assert float(score) == pytest.approx(now)
    [claimed] = await broker.claim_alerts(10, LEASE, now)
    assert claimed.queue == "mail"
    assert await broker.finish_alert(claimed, True, now + 600, None, now)
    assert await backend.cmd(broker.client, "ZCARD", k.alertdue) == 0, "nothing pending"
    assert await backend.cmd(broker.client, "HLEN", k.alerts) == 1, "the quiet window is kept"


async def test_a_dead_payload_alerts_under_the_task_peek_task_reads(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    cases: dict[bytes, str] = {
        b"not json": "?",
        b"[1, 2]": "?",
        b'{"task": 5}': "?",
        b'{"task": "has space"}': "?",
        b'{"task": "c1\\u0085ctrl"}': "?",  # U+0085 is a control character
        b'{"task": "' + b"x" * 201 + b'"}': "?",
        b'{"task": "t.x", "a": "\xff"}': "?",  # not UTF-8: Python reads nothing from it
        b'{"task": "t\\u00e2che.envoi", "args": []}': "tâche.envoi",
        ('{"task": "' + "é" * 200 + '"}').encode(): "é" * 200,  # 200 characters, 400 bytes
    }
    for payload, task in cases.items():
        assert (peek_task(payload) or "?") == task, "the same key as every other broker"
    # Python reads an encoded surrogate (surrogatepass) into a task no client can send back as
    # a key; here it is no task at all.
    cases[b'{"task": "t.\xed\xa0\x80"}'] = "?"
    for payload, task in cases.items():
        await _kill(broker, now, "default", payload, "E")
        keys = {a.key for a in await broker.list_alerts(True, 100)}
        assert f"dead:default:{task}" in keys, payload
    alerts = {a.key: a for a in await broker.list_alerts(True, 100)}
    assert alerts["dead:default:?"].count == 8 and alerts["dead:default:?"].task is None
    assert alerts["dead:default:tâche.envoi"].task == "tâche.envoi"


async def test_the_alert_detail_is_cut_by_characters_and_the_dead_letter_keeps_it_all(
    broker: RedisBroker, clock: FakeClock
) -> None:
    error = "é" * (ALERT_DETAIL_LIMIT + 10)
    jid = await _kill(broker, clock.now(), "default", '{"task": "t.x"}', error)
    [alert] = await broker.list_alerts(True, 10)
    assert alert.detail == "é" * ALERT_DETAIL_LIMIT and alert.job_id == jid
    [dead] = await broker.list_dead("default", 10)
    assert dead.last_error == error
    await broker.record_alert(AlertEvent("stall:default", "stall", "default", None, None, error), 0)
    [_, stall] = await broker.list_alerts(True, 10)
    assert stall.detail == "é" * ALERT_DETAIL_LIMIT


async def test_claim_alerts_takes_the_earliest_across_queues(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    for offset, queue in ((2, "a"), (0, "b"), (3, "b"), (1, "c")):
        event = AlertEvent(f"stall:{queue}:{offset}", "stall", queue, None, None, "slow")
        await broker.record_alert(event, now + offset)
    first = await broker.claim_alerts(3, LEASE, now + 10)
    assert [a.key for a in first] == ["stall:b:0", "stall:c:1", "stall:a:2"]
    assert [a.key for a in await broker.claim_alerts(3, LEASE, now + 10)] == ["stall:b:3"]
    listed = await broker.list_alerts(True, 2)
    assert [a.key for a in listed] == ["stall:b:0", "stall:c:1"], "oldest first_at first"


async def test_a_finish_without_a_claim_token_writes_nothing(
    broker: RedisBroker, clock: FakeClock
) -> None:
    await broker.record_alert(AlertEvent("k", "stall", "default", None, None, "d"), clock.now())
    [row] = await broker.list_alerts(True, 10)
    assert row.token is None
    assert not await broker.finish_alert(row, True, clock.now(), None, clock.now())
    [forged] = await broker.list_alerts(True, 10)
    forged.token = "not-the-token"
    assert not await broker.finish_alert(forged, True, clock.now(), None, clock.now())
    assert (await broker.list_alerts(True, 10))[0].count == 1


async def test_a_due_entry_whose_row_is_gone_is_dropped_not_claimed_forever(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    for key in ("stall:gone", "stall:kept"):
        await broker.record_alert(AlertEvent(key, "stall", "default", None, None, "d"), now)
    k = broker.keys("default")
    await backend.cmd(broker.client, "HDEL", k.alerts, "stall:gone")
    assert [a.key for a in await broker.claim_alerts(1, LEASE, now)] == []
    assert [a.key for a in await broker.claim_alerts(1, LEASE, now)] == ["stall:kept"]
    assert await backend.cmd(broker.client, "ZSCORE", k.alertdue, "stall:gone") is None


# -- flow control --------------------------------------------------------------------------------


async def test_rate_and_slot_keys_expire_a_little_after_they_stop_mattering(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    assert await broker.acquire_rate("task:t.x", 20.0, now) == 0.0
    pttl = await backend.cmd(broker.client, "PTTL", broker.flow_key("rate", "task:t.x"))
    assert 20_000 < pttl <= 22_000
    slots = broker.flow_key("slots", "task:t.x")
    assert await broker.acquire_slot("task:t.x", "long", 5, 100, now)
    assert await broker.acquire_slot("task:t.x", "short", 5, 10, now)
    assert 100_000 < await backend.cmd(broker.client, "PTTL", slots) <= 102_000, "not shortened"
    await broker.extend_slots([("task:t.x", "short")], 300, now)
    assert 300_000 < await backend.cmd(broker.client, "PTTL", slots) <= 302_000
    await broker.release_slots([("task:t.x", "long"), ("task:t.x", "short")])
    assert await backend.cmd(broker.client, "EXISTS", slots) == 0


async def test_limit_keys_with_braces_stay_apart(broker: RedisBroker, clock: FakeClock) -> None:
    now = clock.now()
    names = ["a{b}", "a{c}", "{}", "", "a}"]
    keys = {broker.flow_key("rate", n) for n in names}
    assert len(keys) == len(names)
    for key in keys:
        assert key.count("{") == key.count("}") == 1
    for name in names:
        assert await broker.acquire_rate(name, 5.0, now) == 0.0, name
        assert await broker.acquire_slot(name, "h", 1, 5, now), name


async def test_an_expired_slot_nobody_took_is_extended_again(
    broker: RedisBroker, clock: FakeClock
) -> None:
    """As in the reference broker: only another acquire drops an expired holder."""
    now = clock.now()
    assert await broker.acquire_slot("k", "slow", 1, 10, now)
    await broker.extend_slots([("k", "slow")], 10, now + 15)
    assert not await broker.acquire_slot("k", "other", 1, 10, now + 20)


# -- stats.oldest_ready_at -----------------------------------------------------------------------


async def test_the_oldest_ready_job_is_found_across_priorities(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    await broker.enqueue([Job(task="t.hi", priority=9)], now + 5)
    await broker.enqueue([Job(task="t.lo", priority=-1)], now + 1)
    await broker.enqueue([Job(task="t.mid", priority=3)], now + 2)
    await broker.enqueue([Job(task="t.due", run_at=now + 3)], now)  # due, not yet promoted
    assert (await broker.stats(now + 10))["default"].oldest_ready_at == pytest.approx(now + 1)


async def test_foreign_payloads_are_dated_when_first_seen(
    broker: RedisBroker, clock: FakeClock
) -> None:
    now = clock.now()
    k = broker.keys("q")
    await backend.cmd(broker.client, "LPUSH", k.ready, '{"task": "t.x"}')
    await backend.cmd(broker.client, "SADD", f"{broker.prefix}:queues", "q")
    assert (await broker.stats(now))["q"].oldest_ready_at == pytest.approx(now)
    st = (await broker.stats(now + 60))["q"]
    assert st.ready == 1 and st.oldest_ready_at == pytest.approx(now), "the first sighting"
    assert len(await broker.reserve(["q"], 1, LEASE, 0, now + 61)) == 1
    assert await backend.cmd(broker.client, "EXISTS", k.rawsince) == 0, "the inbox is empty"
    assert (await broker.stats(now + 61))["q"].oldest_ready_at is None
    # enqueue_raw dates its payload itself, before any stats call sees it.
    await broker.enqueue_raw("q", '{"task": "t.y"}', now + 70)
    assert (await broker.stats(now + 90))["q"].oldest_ready_at == pytest.approx(now + 70)
