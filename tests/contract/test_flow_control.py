"""Rate limits and concurrency slots shared by every caller of one broker (the broker half of
issue 8); tests/contract/test_limits_worker.py drives workers through them."""

from __future__ import annotations

import anyio
import pytest

from taskkit.broker import Broker
from taskkit.testing import FakeClock
from tests.contract.test_broker import MakeBroker

pytestmark = pytest.mark.anyio


async def test_a_rate_grants_one_call_per_interval(broker: Broker, clock: FakeClock) -> None:
    now = clock.now()
    assert await broker.acquire_rate("task:api.call", 2.0, now) == 0.0
    assert await broker.acquire_rate("task:api.call", 2.0, now + 0.5) == pytest.approx(1.5)
    # A refusal records nothing: the next free time did not move.
    assert await broker.acquire_rate("task:api.call", 2.0, now + 1.5) == pytest.approx(0.5)
    assert await broker.acquire_rate("task:api.call", 2.0, now + 2.0) == 0.0
    assert await broker.acquire_rate("task:other", 2.0, now + 2.0) == 0.0


async def test_racing_callers_get_one_grant_per_interval(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    brokers = [await make_broker() for _ in range(4)]
    now = clock.now()
    grants: list[float] = []

    async def ask(b: Broker) -> None:
        for _ in range(5):
            if await b.acquire_rate("task:racy", 10.0, now) == 0.0:
                grants.append(now)

    async with anyio.create_task_group() as tg:
        for b in brokers:
            tg.start_soon(ask, b)
    assert len(grants) == 1


async def test_slots_admit_up_to_the_limit_and_come_back_on_release(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    key = "task:render.video"
    assert await broker.acquire_slot(key, "j1", 2, 30, now)
    assert await broker.acquire_slot(key, "j2", 2, 30, now)
    assert not await broker.acquire_slot(key, "j3", 2, 30, now)
    assert await broker.acquire_slot(key, "j1", 2, 30, now)  # a holder asking again keeps its own
    assert await broker.acquire_slot("task:other", "j3", 2, 30, now)  # keys are independent
    await broker.release_slots([(key, "j1"), (key, "never-held")])
    assert await broker.acquire_slot(key, "j3", 2, 30, now)
    assert not await broker.acquire_slot(key, "j4", 2, 30, now)


async def test_a_dead_holders_slot_comes_back_when_it_expires(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    key = "queue:video"
    assert await broker.acquire_slot(key, "alive", 2, 30, now)
    assert await broker.acquire_slot(key, "dies", 2, 30, now)
    # Only the live holder heartbeats; the dead one's slot runs out.
    await broker.extend_slots([(key, "alive")], 30, now + 20)
    assert not await broker.acquire_slot(key, "new", 2, 30, now + 29)
    assert await broker.acquire_slot(key, "new", 2, 30, now + 31)
    assert not await broker.acquire_slot(key, "newer", 2, 30, now + 31)  # "alive" still holds
    assert await broker.acquire_slot(key, "newer", 2, 30, now + 51)


async def test_extending_a_slot_that_was_lost_does_not_take_it_again(
    broker: Broker, clock: FakeClock
) -> None:
    now = clock.now()
    assert await broker.acquire_slot("k", "a", 1, 10, now)
    assert await broker.acquire_slot("k", "b", 1, 10, now + 11)  # a expired, b took it
    await broker.extend_slots([("k", "a")], 10, now + 12)
    assert not await broker.acquire_slot("k", "c", 1, 10, now + 15)
    await broker.release_slots([("k", "b")])
    assert await broker.acquire_slot("k", "c", 1, 10, now + 15)


async def test_racing_callers_never_exceed_the_slot_limit(
    make_broker: MakeBroker, clock: FakeClock
) -> None:
    brokers = [await make_broker() for _ in range(4)]
    now = clock.now()
    won: list[str] = []

    async def ask(b: Broker, n: int) -> None:
        for i in range(5):
            holder = f"{n}-{i}"
            if await b.acquire_slot("task:racy", holder, 3, 30, now):
                won.append(holder)

    async with anyio.create_task_group() as tg:
        for n, b in enumerate(brokers):
            tg.start_soon(ask, b, n)
    assert len(won) == 3
