"""PostgresBroker mechanics on a real server: migrations, table hygiene, transactional and SQL
enqueue, wake-ups, the claim plan. Behaviour lives in tests/contract; this is how it is built."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest

from brokers.postgres import LATEST_VERSION, PostgresBroker, parse_url
from taskkit.errors import BrokerUnavailable, SchemaMissing
from taskkit.job import Job, JobState, decode_job
from taskkit.outcome import Complete, DeadLetter, Retry
from tests.backends.postgres import (
    drop_schema,
    migrated_schema,
    schema_url,
    server_url,
    unique_schema,
)

pytestmark = pytest.mark.anyio

LEASE = 30.0


@pytest.fixture
async def url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A migrated schema of its own."""
    async with migrated_schema(request.node.name) as u:
        yield u


@pytest.fixture
async def bare_url(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A schema name nobody has migrated yet (dropped at the end if a test created it)."""
    u = schema_url(server_url(), unique_schema(request.node.name))
    yield u
    await drop_schema(u)


async def connect_raw(url: str) -> asyncpg.Connection:
    return await asyncpg.connect(parse_url(url).dsn)


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{host}"))


async def count_rows(url: str) -> int:
    conn = await connect_raw(url)
    try:
        return int(await conn.fetchval(f'SELECT count(*) FROM "{parse_url(url).schema}".jobs'))
    finally:
        await conn.close()


# -- migrations and connect ----------------------------------------------------------------------


async def test_migrate_is_idempotent(bare_url: str) -> None:
    broker = PostgresBroker(bare_url)
    assert await broker.migrate() == [LATEST_VERSION]
    assert await broker.migrate() == []
    async with broker:
        assert await broker.stats(time.time()) == {}


async def test_concurrent_migrations_apply_each_version_once(bare_url: str) -> None:
    results: list[list[str]] = []

    async def migrate() -> None:
        results.append(await PostgresBroker(bare_url).migrate())

    async with anyio.create_task_group() as tg:
        for _ in range(6):
            tg.start_soon(migrate)
    assert sorted(results) == [[]] * 5 + [[LATEST_VERSION]]
    conn = await connect_raw(bare_url)
    try:
        versions = await conn.fetch(
            f'SELECT version FROM "{parse_url(bare_url).schema}".schema_version'
        )
    finally:
        await conn.close()
    assert [r["version"] for r in versions] == [LATEST_VERSION]


async def test_connect_on_a_missing_schema_names_the_fix_and_hides_the_password(
    bare_url: str,
) -> None:
    secret_url = with_password(bare_url, "s3cret-pw")
    with pytest.raises(SchemaMissing) as info:
        await PostgresBroker(secret_url).connect()
    message = str(info.value)
    assert "taskkit migrate --broker" in message and "\n" not in message
    assert "s3cret-pw" not in message and parse_url(bare_url).schema in message


async def test_connect_on_an_old_schema_raises_schema_missing(url: str) -> None:
    conn = await connect_raw(url)
    try:
        await conn.execute(f'DELETE FROM "{parse_url(url).schema}".schema_version')
    finally:
        await conn.close()
    with pytest.raises(SchemaMissing, match="not applied: 0001_initial"):
        await PostgresBroker(url).connect()


async def test_an_unreachable_server_raises_broker_unavailable() -> None:
    url = "postgresql://postgres:s3cret-pw@127.0.0.1:1/test?schema=x"
    for attempt in (PostgresBroker(url).connect, PostgresBroker(url).migrate):
        with pytest.raises(BrokerUnavailable) as info:
            await attempt()
        message = str(info.value)
        assert "127.0.0.1:1" in message and "s3cret-pw" not in message and "\n" not in message


async def test_calls_before_connect_raise_a_taskkit_error(url: str) -> None:
    from taskkit.errors import BrokerError

    with pytest.raises(BrokerError, match="not connected"):
        await PostgresBroker(url).reserve(["default"], 1, LEASE, 0, time.time())


# -- table hygiene -------------------------------------------------------------------------------


async def test_a_drained_queue_leaves_no_rows(url: str) -> None:
    now = time.time()
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t.noop", args=[i]) for i in range(500)], now)
        drained = 0
        while got := await broker.reserve(["default"], 64, LEASE, 0, now):
            assert all(await broker.settle([(d.lease, Complete()) for d in got], now))
            drained += len(got)
        assert drained == 500
    assert await count_rows(url) == 0


async def test_expired_results_are_pruned_by_the_reaper(url: str) -> None:
    now = time.time()
    async with PostgresBroker(url) as broker:
        [jid] = await broker.enqueue([Job(task="t.noop")], now)
        [d] = await broker.reserve(["default"], 1, LEASE, 0, now)
        await broker.settle([(d.lease, Complete('"ok"', keep_until=now + 60))], now)
        await broker.reclaim_expired(["default"], LEASE, 10, now + 1)
        assert await count_rows(url) == 1, "a kept result stays until it expires"
        await broker.reclaim_expired(["default"], LEASE, 10, now + 61)
        assert await count_rows(url) == 0
        assert await broker.get_job(jid, now + 61) is None


async def test_a_batch_settles_in_input_order_and_a_repeated_lease_counts_once(url: str) -> None:
    now = time.time()
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t.noop") for _ in range(3)], now)
        a, b, c = await broker.reserve(["default"], 3, LEASE, 0, now)
        applied = await broker.settle(
            [
                (c.lease, DeadLetter("x")),
                (a.lease, Complete()),
                (a.lease, Complete()),
                (b.lease, Retry(now, "again")),
            ],
            now,
        )
        assert applied == [True, True, False, True]
        assert await broker.extend([b.lease, c.lease], LEASE, now) == [b.lease, c.lease]


async def test_racing_enqueues_with_one_dedupe_key_store_one_job(url: str) -> None:
    brokers = [PostgresBroker(url) for _ in range(6)]
    ids: list[str] = []

    async def enqueue(broker: PostgresBroker) -> None:
        ids.extend(await broker.enqueue([Job(task="t.noop", dedupe_key="race")], time.time()))

    try:
        for broker in brokers:
            await broker.connect()
        async with anyio.create_task_group() as tg:
            for broker in brokers:
                tg.start_soon(enqueue, broker)
    finally:
        for broker in brokers:
            await broker.close()
    assert len(ids) == 6 and len(set(ids)) == 1
    assert await count_rows(url) == 1


async def test_undecodable_bytes_are_delivered_as_bytes(url: str) -> None:
    async with PostgresBroker(url) as broker:
        now = time.time()
        bad = await broker.enqueue_raw("default", b"\xff\xfe{}", now)
        nul = await broker.enqueue_raw("default", '{"task": "a\x00b"}', now)
        got = {d.job_id: d.payload for d in await broker.reserve(["default"], 5, LEASE, 0, now)}
    assert got == {bad: b"\xff\xfe{}", nul: b'{"task": "a\x00b"}'}


# -- transactional enqueue -----------------------------------------------------------------------


async def test_enqueue_in_a_committed_transaction_wakes_a_worker_at_commit(url: str) -> None:
    producer = PostgresBroker(url)
    conn = await connect_raw(url)
    got: list[str] = []
    async with PostgresBroker(url, poll_interval=60) as consumer:

        async def consume() -> None:
            got.extend(d.job_id for d in await consumer.reserve(["default"], 1, LEASE, 10, 0))

        try:
            with anyio.fail_after(5):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consume)
                    await anyio.sleep(0.2)
                    async with conn.transaction():
                        [jid] = await producer.enqueue_in(conn, [Job(task="t.noop", run_at=0)], 0)
                        assert await consumer.get_job(jid, 0) is None, "visible before commit"
                        await anyio.sleep(0.3)
                        assert got == [], "woken before commit"
        finally:
            await conn.close()
    assert got == [jid]


async def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(url: str) -> None:
    conn = await connect_raw(url)
    try:
        tx = conn.transaction()
        await tx.start()
        [jid] = await PostgresBroker(url).enqueue_in(conn, [Job(task="t.noop")], time.time())
        await tx.rollback()
    finally:
        await conn.close()
    async with PostgresBroker(url) as broker:
        assert await broker.get_job(jid, time.time()) is None
    assert await count_rows(url) == 0


# -- the SQL function for foreign producers ------------------------------------------------------


async def test_the_sql_enqueue_function_called_from_psql_makes_a_runnable_job(url: str) -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql is needed for this test (apt-get install postgresql-client)"
    opts = parse_url(url)
    sql = (
        f"SELECT \"{opts.schema}\".enqueue('emails.send', '[\"a@example.com\"]', "
        f"'{{\"subject\": \"hi\"}}', queue => 'mail', dedupe_key => 'welcome:1')"
    )
    runs = [
        await anyio.run_process([psql, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql, opts.dsn])
        for _ in range(2)
    ]
    first, second = (r.stdout.decode().strip() for r in runs)
    assert first == second and len(first) == 32, "the dedupe key returns the holder's id"
    async with PostgresBroker(url) as broker:
        [d] = await broker.reserve(["mail"], 5, LEASE, 0, time.time() + 1)
        info = await broker.get_job(first, time.time() + 1)
    job = decode_job(d.payload)
    assert d.job_id == first == job.id
    assert (job.task, job.args, job.kwargs, job.queue) == (
        "emails.send", ["a@example.com"], {"subject": "hi"}, "mail",
    )
    assert info is not None and info.task == "emails.send" and info.dedupe_key == "welcome:1"


async def test_the_sql_enqueue_function_refuses_a_bad_queue_name(url: str) -> None:
    conn = await connect_raw(url)
    try:
        with pytest.raises(asyncpg.InvalidParameterValueError, match="invalid queue name"):
            await conn.fetchval(
                f"SELECT \"{parse_url(url).schema}\".enqueue('t', queue => 'no spaces')"
            )
        later = await conn.fetchval(
            f"SELECT \"{parse_url(url).schema}\".enqueue('t', run_at => now() + interval '1 h')"
        )
    finally:
        await conn.close()
    async with PostgresBroker(url) as broker:
        info = await broker.get_job(later, time.time())
    assert info is not None and info.state is JobState.SCHEDULED


async def test_a_bare_insert_of_a_payload_is_a_runnable_job(url: str) -> None:
    conn = await connect_raw(url)
    try:
        jid = await conn.fetchval(
            f'INSERT INTO "{parse_url(url).schema}".jobs (payload) '
            """VALUES ('{"task": "t.raw", "args": [1]}') RETURNING id"""
        )
    finally:
        await conn.close()
    async with PostgresBroker(url) as broker:
        info = await broker.get_job(jid, time.time() + 1)
        [d] = await broker.reserve(["default"], 1, LEASE, 0, time.time() + 1)
    assert info is not None and info.task == "t.raw" and info.state is JobState.PENDING
    assert d.job_id == jid and decode_job(d.payload).args == [1]


# -- wake-ups ------------------------------------------------------------------------------------


async def test_the_listener_is_rearmed_after_its_connection_dies(url: str) -> None:
    async with PostgresBroker(url, poll_interval=60) as consumer, PostgresBroker(url) as producer:
        got: list[str] = []

        async def consume() -> None:
            got.extend(d.job_id for d in await consumer.reserve(["default"], 1, LEASE, 10, 0))

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await anyio.sleep(0.2)
                listener = consumer._listener
                assert listener is not None
                await producer.pool.fetchval(
                    "SELECT pg_terminate_backend($1)", listener.get_server_pid()
                )
                await anyio.sleep(0.5)
                assert consumer._listener is not None and consumer._listener is not listener
                [jid] = await producer.enqueue([Job(task="t.noop", run_at=0)], 0)
        assert got == [jid]


async def test_pgbouncer_mode_polls_without_listen_or_prepared_statements(url: str) -> None:
    bouncer_url = f"{url}&listen=0&prepared=0"
    async with PostgresBroker(bouncer_url, poll_interval=0.1) as consumer:
        got: list[str] = []

        async def consume() -> None:
            got.extend(d.job_id for d in await consumer.reserve(["default"], 1, LEASE, 5, 0))

        with anyio.fail_after(3):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await anyio.sleep(0.2)
                [jid] = await consumer.enqueue([Job(task="t.noop", run_at=0)], 0)
        assert got == [jid] and consumer._listener is None
        async with consumer.pool.acquire() as conn:
            names = await conn.fetch("SELECT name FROM pg_prepared_statements")
        assert names == []


async def test_schemas_do_not_see_or_wake_each_other(url: str, bare_url: str) -> None:
    await PostgresBroker(bare_url).migrate()
    async with PostgresBroker(url) as one, PostgresBroker(bare_url, poll_interval=60) as two:
        await one.enqueue([Job(task="t.noop")], 0)
        start = time.monotonic()
        assert await two.reserve(["default"], 1, LEASE, 0.5, 0) == []
        assert time.monotonic() - start >= 0.45
        assert len(await one.reserve(["default"], 1, LEASE, 0, 0)) == 1


# -- the claim plan ------------------------------------------------------------------------------


async def test_the_claim_reads_the_partial_claim_index(url: str) -> None:
    async with PostgresBroker(url) as broker:
        now = time.time()
        for queue in ("a", "b"):
            await broker.enqueue([Job(task="t", queue=queue) for _ in range(2000)], now)
        async with broker.pool.acquire() as conn:
            await conn.execute(f'ANALYZE "{parse_url(url).schema}".jobs')
            plan = await conn.fetch(
                "EXPLAIN (COSTS OFF) " + broker.query("claim"), ["b", "a"], now, 10, LEASE
            )
    text = "\n".join(r[0] for r in plan)
    assert "Index Scan using jobs_claim_idx" in text, text
    assert "Seq Scan on jobs" not in text, text


async def test_a_reserve_cancelled_during_its_claim_hands_the_jobs_back(url: str) -> None:
    async with PostgresBroker(url) as broker:
        [jid] = await broker.enqueue([Job(task="t.noop", run_at=-5)], 0)
        with anyio.CancelScope() as scope:
            scope.cancel()  # already cancelled when the claim statement runs
            await broker.reserve(["default"], 1, LEASE, 0, 0)
        info = await broker.get_job(jid, 0)
        assert info is not None and info.state is JobState.PENDING and info.attempts == 0
        assert info.run_at == 0, "claimed, then released (run_at = now)"


async def test_batched_writes_do_not_scan_the_running_set_per_row(url: str) -> None:
    """Statistics taken while nothing ran must not steer settle/extend/release into scanning
    the running set once per batch row (see the fencing note in postgres_migrations.sql); a
    primary-key lookup (or, on a small table, a hash join) is what they should do."""
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t") for _ in range(2000)], 0)
        async with broker.pool.acquire() as conn:
            await conn.execute(f'ANALYZE "{parse_url(url).schema}".jobs')
        got = await broker.reserve(["default"], 200, LEASE, 0, 0)
        ids, tokens = [d.job_id for d in got], [d.lease.token for d in got]
        n = len(got)
        plans = {
            "settle": (ids, tokens, ["ack"] * n, [None] * n, [None] * n, [True] * n, 0.0),
            "extend": (ids, tokens, 60.0),
            "release": (ids, tokens, 0.0),
        }
        async with broker.pool.acquire() as conn:
            for name, args in plans.items():
                rows = await conn.fetch("EXPLAIN (COSTS OFF) " + broker.query(name), *args)
                text = "\n".join(r[0] for r in rows)
                assert "jobs_running_idx" not in text, (name, text)


async def test_requeue_skips_a_dead_job_whose_dedupe_key_is_taken(url: str) -> None:
    async with PostgresBroker(url) as broker:
        dead = [Job(task="t", dedupe_key="k"), Job(task="t", dedupe_key="k")]
        for job in dead:
            await broker.enqueue([job], 0)
            [d] = await broker.reserve(["default"], 1, LEASE, 0, 0)
            await broker.settle([(d.lease, DeadLetter("x"))], 0)
        assert await broker.requeue_dead(None, None, 0) == [dead[0].id], "one key, one revival"
        assert await broker.requeue_dead(None, None, 0) == [], "the key is held now"
