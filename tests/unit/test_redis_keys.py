"""Mechanics of the Redis broker's storage (behaviour is in tests/contract/):

- every key it writes is under the prefix, the keys of one queue share the queue's hash tag, a
  rate or slot key is its own hash tag, and every Lua script touches only the keys it was passed
  (checked with MONITOR on a real server);
- an element that BLMOVE moved into a processing list just before the worker died is recovered
  by another worker once the processing grace period is over;
- a foreign producer's ``redis-cli LPUSH`` (the real binary) is delivered, good or malformed;
- the BLMOVE wait stays inside the client's socket timeout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from brokers.redis import RedisBroker
from taskkit.errors import PayloadInvalid
from taskkit.job import AlertEvent, Job, JobState, decode_job
from taskkit.outcome import Complete, DeadLetter, Retry
from taskkit.testing import FakeClock
from tests import servers
from tests.backends import BrokerSpace
from tests.backends import redis as backend

pytestmark = pytest.mark.anyio
LEASE = 30.0


@pytest.fixture
async def real(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    """An isolated prefix on the real test server."""
    servers.ensure_redis()
    async with backend.space(backend.unique_prefix(request.node.name), tmp_path, "redis") as sp:
        yield sp


@pytest.fixture(params=backend.NAMES)
async def either(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    """The real server and fakeredis."""
    if request.param == "redis":
        servers.ensure_redis()
    prefix = backend.unique_prefix(request.node.name)
    async with backend.space(prefix, tmp_path, request.param) as sp:
        yield sp


async def connected(space: BrokerSpace) -> RedisBroker:
    broker = space.make()
    assert isinstance(broker, RedisBroker)
    await broker.connect()
    return broker


def redis_cli() -> str:
    found = shutil.which("redis-cli")
    if found is None:
        pytest.fail("redis-cli is not installed (apt-get install redis-tools)", pytrace=False)
    return found


# -- keys ----------------------------------------------------------------------------------------

_LINE = re.compile(r"^\d+\.\d+ \[\d+ (?P<who>[^\]]+)\] (?P<args>.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')
_TAG = re.compile(r"\{([^}]*)\}")


def _tag(key: str) -> str | None:
    found = _TAG.search(key)
    return found.group(1) if found and found.group(1) else None


async def _all_keys(broker: RedisBroker) -> set[str]:
    return {k.decode() async for k in broker.client.scan_iter(count=1000)}


async def _workload(space: BrokerSpace, clock: FakeClock) -> RedisBroker:
    """Run every broker operation (so every script) on queues "default" and "mail"."""
    b, other = await connected(space), await connected(space)
    now = clock.now()
    await b.enqueue(
        [
            Job(task="t.a", priority=3, dedupe_key="d1"),
            Job(task="t.b", run_at=now + 5),
            Job(task="t.c", dedupe_key="d1"),
            Job(task="t.m", queue="mail"),
            Job(task="t.m2", queue="mail", id="custom-id"),
        ],
        now,
    )
    await b.enqueue_raw("default", '{"task": "t.raw"}', now)
    await b.enqueue_raw("default", "0123456789abcdef0123456789abcdef", now)
    got = await b.reserve(["default", "mail"], 10, LEASE, 0, now)
    assert len(got) == 5
    assert await b.extend([d.lease for d in got], LEASE, now) == []
    assert await b.set_progress(got[0].lease, '{"step": 1}', now) is True
    scheduled = (await b.stats(now))["default"].scheduled
    assert scheduled == 1 and await b.cancel(got[0].job_id, now + 60, now) is JobState.RUNNING
    outcomes: list[Any] = [
        Complete(),
        Complete('{"r": 1}', keep_until=now + 600),
        Retry(now + 1, "boom"),
        DeadLetter("fatal"),
    ]
    pairs = list(zip((d.lease for d in got), outcomes, strict=False))
    assert await b.settle(pairs, now) == [True] * 4
    await b.release([got[4].lease], now)
    [again] = await b.reserve(["default", "mail"], 1, LEASE, 0, now)
    await b.settle([(again.lease, Complete(None, keep_until=now + 600))], now)
    [_short] = await b.reserve(["default", "mail"], 1, 1, 0, clock.advance(1))
    assert len(await other.reclaim_expired(["default", "mail"], LEASE, 10, clock.advance(2))) == 1
    # A waiting reserve on two queues (concurrent BLMOVEs) woken by an enqueue on the second.
    clock.advance(10)
    await other.reserve(["default", "mail"], 10, LEASE, 0, clock.now())  # take what is due

    async def produce() -> None:
        await anyio.sleep(0.2)
        await b.enqueue([Job(task="t.late", queue="mail")], clock.now())

    async with anyio.create_task_group() as tg:
        tg.start_soon(produce)
        woke = await other.reserve(["default", "mail"], 1, LEASE, 3, clock.now())
    assert [d.lease.queue for d in woke] == ["mail"]
    for info in await b.list_dead(None, 10):
        await b.get_job(info.id, clock.now())
    assert len(await b.requeue_dead(None, None, clock.now())) == 1
    [dead] = await b.reserve(["default", "mail"], 1, LEASE, 0, clock.now())
    await b.settle([(dead.lease, DeadLetter("again"))], clock.now())
    assert await b.purge_dead(None, None) == 1
    [later] = await b.enqueue([Job(task="t.later", run_at=clock.now() + 60)], clock.now())
    assert await b.cancel(later, clock.now() + 60, clock.now()) is JobState.CANCELLED
    await b.set_paused("mail", True)
    await b.stats(clock.now())
    await b.set_paused("mail", False)
    # The alert outbox (the first dead letter above recorded an alert on "mail") and flow
    # control, with a limit key holding braces that must not cut the hash tag short.
    stall = AlertEvent("stall:default", "stall", "default", None, None, "waited")
    await b.record_alert(stall, clock.now())
    claimed = await other.claim_alerts(10, LEASE, clock.now())
    assert {a.queue for a in claimed} == {"default", "mail"}
    assert await other.finish_alert(claimed[0], True, clock.now() + 600, None, clock.now())
    assert await other.finish_alert(claimed[1], False, clock.now() + 5, "HTTP 503", clock.now())
    assert len(await b.list_alerts(False, 10)) == len(claimed)
    assert await b.acquire_rate("task:t.a", 5.0, clock.now()) == 0.0
    assert await b.acquire_rate("task:t.a", 5.0, clock.now()) == 5.0
    for key in ("task:t.a", "task:{odd}"):
        assert await b.acquire_slot(key, "h1", 1, 30, clock.now())
        assert not await other.acquire_slot(key, "h2", 1, 30, clock.now())
    await b.extend_slots([("task:t.a", "h1"), ("task:{odd}", "h1")], 30, clock.now())
    await b.release_slots([("task:t.a", "h1")])
    # A broker that dies between BLMOVE and its claim, recovered by another after the grace.
    crashed = await connected(space)
    await crashed.reserve(["mail"], 1, LEASE, 0, clock.now())
    await b.enqueue_raw("mail", b"{not json", clock.now())
    k = crashed.keys("mail")
    await backend.cmd(
        crashed.client, "BLMOVE", k.ready, k.processing(crashed.broker_id), "RIGHT", "LEFT", 1
    )
    await crashed.client.aclose()
    await other.reclaim_expired(["mail"], LEASE, 10, clock.advance(crashed.processing_grace + 1))
    await other.close()
    return b


async def test_every_key_is_under_the_prefix_and_each_script_keeps_to_its_keys(
    real: BrokerSpace, clock: FakeClock, tmp_path: Path
) -> None:
    assert real.url is not None
    probe = await connected(real)
    prefix = probe.prefix
    before = await _all_keys(probe)
    log = tmp_path / "monitor.txt"
    with log.open("w") as out:
        monitor = subprocess.Popen(
            [redis_cli(), "-u", backend.server_url(), "MONITOR"], stdout=out, stderr=out
        )
        try:
            with anyio.fail_after(10):
                while "OK" not in log.read_text():
                    await anyio.sleep(0.02)
            b = await _workload(real, clock)
            await anyio.sleep(0.3)  # let MONITOR catch up
            after = await _all_keys(probe)
        finally:
            monitor.terminate()
            monitor.wait(10)

    # 1. Every key we wrote is under the prefix; each queue's keys carry its hash tag, each rate
    # or slot key its own (a brace in the limit key is hashed away).
    ours = {k for k in after if k.startswith(f"{prefix}:")}
    assert f"{prefix}:queues" in ours
    p = re.escape(prefix)
    for key in ours - {f"{prefix}:queues"}:
        queue_key = re.fullmatch(rf"{p}:\{{(default|mail)\}}:[a-z]+(:.+)?", key)
        assert queue_key or re.fullmatch(rf"{p}:(rate|slots):\{{[^{{}}]+\}}(:sha1)?", key), key
    odd = b.flow_key("slots", "task:{odd}")
    assert re.fullmatch(rf"{p}:slots:\{{[0-9a-f]{{40}}\}}:sha1", odd)
    assert {f"{prefix}:rate:{{task:t.a}}", odd} <= ours
    assert f"{prefix}:slots:{{task:t.a}}" not in ours, "the last release deletes the zset"
    assert {_tag(k) for k in ours} == {None, "default", "mail", "task:t.a", _tag(odd)}
    # Nothing outside the prefix, except other tests' prefixes on a shared server.
    strays = {k for k in after - before - ours if not re.match(r"t\d+_", k)}
    assert strays == set()

    # 2. MONITOR: every script call names keys of one hash tag, and touches no other key.
    lines = log.read_text(errors="replace").splitlines()
    declared: set[str] | None = None
    checked_calls = checked_inner = 0
    for line in lines:
        match = _LINE.match(line)
        if match is None:
            continue
        args = _ARG.findall(match["args"])
        if match["who"] == "lua":
            if declared is not None:
                assert args[1] in declared, f"a script touched undeclared key {args[1]}: {line}"
                checked_inner += 1
            continue
        declared = None
        command = args[0].upper()
        if command in ("EVALSHA", "EVAL") and any(a.startswith(f"{prefix}:") for a in args):
            keys = args[3 : 3 + int(args[2])]
            assert len({_tag(k) for k in keys}) == 1 and _tag(keys[0]), keys
            assert all(re.match(rf"{re.escape(prefix)}:((rate|slots):)?\{{", k) for k in keys)
            declared = set(keys)
            checked_calls += 1
        elif command == "BLMOVE" and args[1].startswith(f"{prefix}:"):
            assert _tag(args[1]) == _tag(args[2]) is not None
    assert checked_calls > 20 and checked_inner > 100, (checked_calls, checked_inner)
    await b.close()
    await probe.close()


async def test_the_blmove_wait_stays_inside_the_socket_timeout(
    real: BrokerSpace, clock: FakeClock
) -> None:
    b = RedisBroker(f"{real.url}&socket_timeout=0.6")
    await b.connect()
    started = time.monotonic()
    assert await b.reserve(["default"], 1, LEASE, 1.5, clock.now()) == []
    assert 1.4 < time.monotonic() - started < 3
    await b.close()


# -- the crash window between BLMOVE and the claim -------------------------------------------


async def test_an_element_moved_by_a_broker_that_died_is_recovered_after_the_grace_period(
    either: BrokerSpace, clock: FakeClock
) -> None:
    crashed, survivor = await connected(either), await connected(either)
    k = crashed.keys("default")
    assert await crashed.reserve(["default"], 1, LEASE, 0, clock.now()) == []  # seen at T
    payload = b'{"task": "t.noop", "args": [1]}'
    await backend.cmd(survivor.client, "LPUSH", k.ready, payload)  # a foreign producer
    # The crashed worker's BLMOVE took it; the process died before its claim script ran.
    processing = k.processing(crashed.broker_id)
    moved = await backend.cmd(crashed.client, "BLMOVE", k.ready, processing, "RIGHT", "LEFT", 1)
    assert moved == payload
    await crashed.client.aclose()

    assert await survivor.reserve(["default"], 5, LEASE, 0, clock.now()) == []
    grace = crashed.processing_grace
    assert await survivor.reclaim_expired(["default"], LEASE, 10, clock.advance(grace - 1)) == []
    assert await survivor.reserve(["default"], 5, LEASE, 0, clock.now()) == [], "within grace"
    assert await backend.cmd(survivor.client, "LLEN", processing) == 1

    await survivor.reclaim_expired(["default"], LEASE, 10, clock.advance(2))
    [d] = await survivor.reserve(["default"], 5, LEASE, 0, clock.now())
    assert d.payload == payload and d.attempts == 1
    assert await backend.cmd(survivor.client, "EXISTS", processing) == 0
    assert await backend.cmd(survivor.client, "ZSCORE", k.workers, crashed.broker_id) is None
    await survivor.close()


async def test_a_live_broker_claims_what_its_own_interrupted_blmove_moved(
    either: BrokerSpace, clock: FakeClock
) -> None:
    broker = await connected(either)
    k = broker.keys("default")
    [jid] = await broker.enqueue([Job(task="t.noop")], clock.now())
    await broker.enqueue_raw("default", '{"task": "t.raw"}', clock.now())
    processing = k.processing(broker.broker_id)
    for _ in range(2):  # e.g. a BLMOVE cancelled after the server had served it
        await backend.cmd(broker.client, "BLMOVE", k.ready, processing, "RIGHT", "LEFT", 1)
    got = await broker.reserve(["default"], 5, LEASE, 0, clock.now())
    assert len(got) == 2 and jid in {d.job_id for d in got}
    assert await backend.cmd(broker.client, "EXISTS", processing) == 0
    await broker.close()


async def test_close_hands_back_what_blmove_moved_but_no_claim_took(
    either: BrokerSpace, clock: FakeClock
) -> None:
    closing, other = await connected(either), await connected(either)
    k = closing.keys("default")
    await closing.reserve(["default"], 1, LEASE, 0, clock.now())
    await other.enqueue_raw("default", '{"task": "t.raw"}', clock.now())
    processing = k.processing(closing.broker_id)
    await backend.cmd(closing.client, "BLMOVE", k.ready, processing, "RIGHT", "LEFT", 1)
    await closing.close()
    [d] = await other.reserve(["default"], 5, LEASE, 0, clock.now())
    assert decode_job(d.payload).task == "t.raw"
    assert await backend.cmd(other.client, "ZSCORE", k.workers, closing.broker_id) is None
    await other.close()


# -- a foreign producer with the real redis-cli ---------------------------------------------------


async def test_redis_cli_lpush_of_good_and_bad_payloads_is_delivered(
    real: BrokerSpace, clock: FakeClock
) -> None:
    broker = await connected(real)
    ready = broker.keys("default").ready
    good = '{"task": "emails.send", "args": ["a@example.com"], "kwargs": {}}'
    for payload in (good.encode(), b"this is not json", b"\xff\xfe{}"):
        done = subprocess.run(
            [redis_cli(), "-u", backend.server_url(), "LPUSH", ready, payload],
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
    got = await broker.reserve(["default"], 10, LEASE, 0, clock.now())
    assert [d.payload for d in got] == [good.encode(), b"this is not json", b"\xff\xfe{}"]
    assert all(re.fullmatch(r"[0-9a-f]{32}", d.job_id) for d in got)
    assert len({d.job_id for d in got}) == 3 and all(d.attempts == 1 for d in got)
    assert decode_job(got[0].payload).args == ["a@example.com"]
    with pytest.raises(PayloadInvalid, match="not valid JSON"):
        decode_job(got[1].payload)
    with pytest.raises(PayloadInvalid, match="UTF-8"):
        decode_job(got[2].payload)
    info = await broker.get_job(got[1].job_id, clock.now())
    assert (
        info is not None and info.state is JobState.RUNNING and info.payload == "this is not json"
    )
    await broker.settle([(got[1].lease, DeadLetter("PayloadInvalid: not JSON"))], clock.now())
    [dead] = await broker.list_dead("default", 10)
    assert dead.id == got[1].job_id and dead.task is None
    await broker.close()


async def test_blocking_reserve_wakes_on_a_redis_cli_lpush(
    real: BrokerSpace, clock: FakeClock
) -> None:
    broker = await connected(real)
    ready = broker.keys("default").ready
    started = time.monotonic()

    async def push() -> None:
        await anyio.sleep(0.3)
        await anyio.run_process(
            [redis_cli(), "-u", backend.server_url(), "LPUSH", ready, '{"task": "t.x"}']
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(push)
        got = await broker.reserve(["default"], 1, LEASE, 10, clock.now())
    assert len(got) == 1 and time.monotonic() - started < 5
    await broker.close()
