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

from brokers.postgres import _SQL, VERSIONS, PostgresBroker, parse_url
from taskkit.errors import BrokerUnavailable, SchemaMissing
from taskkit.job import ALERT_DETAIL_LIMIT, AlertEvent, Job, JobState, Lease, decode_job
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
    assert await broker.migrate() == list(VERSIONS)
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
    assert sorted(results) == [[]] * 5 + [list(VERSIONS)]
    conn = await connect_raw(bare_url)
    try:
        versions = await conn.fetch(
            f'SELECT version FROM "{parse_url(bare_url).schema}".schema_version'
        )
    finally:
        await conn.close()
    assert sorted(r["version"] for r in versions) == list(VERSIONS)


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
    with pytest.raises(SchemaMissing, match=rf"not applied: {', '.join(VERSIONS)}\)"):
        await PostgresBroker(url).connect()


def test_the_versions_are_the_released_ones_in_order() -> None:
    """Released sections are never renamed or reordered: databases record them by name."""
    assert VERSIONS == ("0001_initial", "0002_cancel_progress", "0003_alerts_flow_control")


async def test_connect_on_a_schema_without_0002_names_the_missing_version(url: str) -> None:
    conn = await connect_raw(url)
    try:
        await conn.execute(
            f'DELETE FROM "{parse_url(url).schema}".schema_version WHERE version <> $1',
            VERSIONS[0],
        )
    finally:
        await conn.close()
    with pytest.raises(
        SchemaMissing, match=r"not applied: 0002_cancel_progress, 0003_alerts_flow_control\)"
    ):
        await PostgresBroker(url).connect()


async def test_0002_upgrades_a_0001_schema_with_live_jobs(bare_url: str) -> None:
    """A schema created by the released 0001 (applied by hand here, as `migrate` did then) and
    holding pending, running and kept jobs is upgraded in place: nothing is lost, the jobs carry
    on, and the new state and columns work."""
    sql = _SQL(parse_url(bare_url).schema)
    (first, initial), jobs = sql.migrations[0], f'"{parse_url(bare_url).schema}".jobs'
    now = 1_000.0
    pending, running, kept = Job(task="t"), Job(task="t", dedupe_key="k"), Job(task="t")
    conn = await connect_raw(bare_url)
    try:
        await conn.execute(sql.q["create_version_table"])
        await conn.execute(initial)
        await conn.execute(sql.q["record_version"], first)
        # Rows as the 0001 statements left them (no started_at or progress columns yet).
        await conn.execute(
            f"INSERT INTO {jobs} (id, state, payload, run_at, enqueued_at) VALUES ($1, 'pending',"
            " $2, $3, $3)",
            pending.id,
            pending.to_wire(),
            now,
        )
        await conn.execute(
            f"INSERT INTO {jobs} (id, state, payload, run_at, enqueued_at, dedupe_key, attempts,"
            " lease_token, lease_until) VALUES ($1, 'running', $2, $3, $3, 'k', 1, 'tok', $4)",
            running.id,
            running.to_wire(),
            now,
            now + 30,
        )
        await conn.execute(
            f"INSERT INTO {jobs} (id, state, payload, run_at, enqueued_at, result, expires_at,"
            " finished_at) VALUES ($1, 'done', $2, $3, $3, '\"ok\"', $4, $3)",
            kept.id,
            kept.to_wire(),
            now,
            now + 60,
        )
    finally:
        await conn.close()
    with pytest.raises(SchemaMissing, match="not applied: 0002_cancel_progress"):
        await PostgresBroker(bare_url).connect()
    assert await PostgresBroker(bare_url).migrate() == list(VERSIONS[1:])
    async with PostgresBroker(bare_url) as broker:
        info = await broker.get_job(kept.id, now)
        assert info is not None and info.state is JobState.DONE and info.result == '"ok"'
        info = await broker.get_job(running.id, now)
        assert info is not None and info.state is JobState.RUNNING and info.started_at is None
        assert await broker.cancel(running.id, now + 60, now) is JobState.RUNNING
        assert await broker.cancel(pending.id, now + 60, now) is JobState.CANCELLED
        [taken] = await broker.reclaim_expired(["default"], LEASE, 10, now + 31)
        assert await broker.set_progress(taken.lease, '{"n": 1}', now + 31)
        assert await broker.settle([(taken.lease, Retry(now + 31, "lost"))], now + 31) == [True]
        [again] = await broker.reserve(["default"], 5, LEASE, 0, now + 32)
        assert again.job_id == running.id and again.attempts == 2
        info = await broker.get_job(running.id, now + 32)
        assert info is not None and info.started_at == now + 32 and info.progress is None
        await broker.reclaim_expired(["default"], LEASE, 10, now + 61)  # prunes both kinds
    assert await count_rows(bare_url) == 1, "only the running job is left"


async def test_0003_upgrades_a_0002_schema_with_live_jobs(bare_url: str) -> None:
    """A schema at 0002 (as `migrate` left it before the alert outbox) holding a running job is
    upgraded by `migrate` alone: connect names the missing version until then, and afterwards the
    job's dead letter records its alert and the flow-control tables work."""
    sql = _SQL(parse_url(bare_url).schema)
    jobs = f'"{parse_url(bare_url).schema}".jobs'
    now = 1_000.0
    running = Job(task="t.upgrade")
    conn = await connect_raw(bare_url)
    try:
        await conn.execute(sql.q["create_version_table"])
        for version, migration in sql.migrations[:2]:
            await conn.execute(migration)
            await conn.execute(sql.q["record_version"], version)
        await conn.execute(
            f"INSERT INTO {jobs} (id, task, state, payload, run_at, enqueued_at, attempts,"
            " lease_token, lease_until, started_at) VALUES ($1, 't.upgrade', 'running', $2, $3,"
            " $3, 1, 'tok', $4, $3)",
            running.id,
            running.to_wire(),
            now,
            now + 30,
        )
    finally:
        await conn.close()
    with pytest.raises(SchemaMissing, match=r"not applied: 0003_alerts_flow_control\)"):
        await PostgresBroker(bare_url).connect()
    assert await PostgresBroker(bare_url).migrate() == ["0003_alerts_flow_control"]
    async with PostgresBroker(bare_url) as broker:
        lease = Lease(running.id, "tok", "default")
        assert await broker.settle([(lease, DeadLetter("E: after the upgrade"))], now) == [True]
        [alert] = await broker.list_alerts(pending_only=True, limit=10)
        assert (alert.key, alert.job_id, alert.count) == ("dead:default:t.upgrade", running.id, 1)
        assert await broker.acquire_rate("r", 1.0, now) == 0.0
        assert await broker.acquire_slot("s", "h", 1, 10.0, now)


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


async def test_single_and_batch_enqueue_resolve_ids_and_dedupe_keys_alike(url: str) -> None:
    """A batch of one takes its own statement (enqueue_one): it must answer as the batch one
    does, for a stored job, a taken id and a held dedupe key, alone or mixed in a batch."""
    async with PostgresBroker(url) as broker:
        now = time.time()
        [held] = await broker.enqueue([Job(task="t", dedupe_key="k")], now)
        first = Job(task="t")
        assert await broker.enqueue([first], now) == [first.id]
        assert await broker.enqueue([first], now) == [first.id], "idempotent by id"
        assert await broker.enqueue([Job(task="t", dedupe_key="k")], now) == [held]
        fresh, dup_key = Job(task="t", dedupe_key="f"), Job(task="t", dedupe_key="f")
        got = await broker.enqueue([fresh, first, Job(task="t", dedupe_key="k"), dup_key], now)
        assert got == [fresh.id, first.id, held, fresh.id]
    assert await count_rows(url) == 3


async def test_the_enqueue_does_not_scan_the_jobs_table(url: str) -> None:
    """The lookups of skipped rows are index probes on those rows only: a hash join against
    every queued job would cost an enqueue time in proportion to the backlog."""
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t", dedupe_key=f"k{i}") for i in range(3000)], 0)
        async with broker.pool.acquire() as conn:
            await conn.execute(f'ANALYZE "{parse_url(url).schema}".jobs')
            jobs = [Job(task="t", dedupe_key=f"k{i}") for i in range(0, 6000, 2)]
            ids = [j.id for j in jobs]
            n = len(jobs)
            args = (
                ids,
                ["default"] * n,
                ["t"] * n,
                [0] * n,
                [0.0] * n,
                [None] * n,
                [j.to_wire() for j in jobs],
                [j.dedupe_key for j in jobs],
                0.0,
            )
            async with conn.transaction():
                await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                plan = await conn.fetch("EXPLAIN (COSTS OFF) " + broker.query("enqueue"), *args)
            one = await conn.fetch(
                "EXPLAIN (COSTS OFF) " + broker.query("enqueue_one"), *(a[0] for a in args[:8]), 0.0
            )
    for rows in (plan, one):
        text = "\n".join(r[0] for r in rows)
        assert "Seq Scan on jobs" not in text, text


async def test_a_claim_commits_without_a_wal_flush_and_leaves_the_session_as_it_was(
    url: str,
) -> None:
    """The claim relaxes synchronous_commit for its own transaction only (see the claim
    statement): the pooled connection must keep the server's setting for every later write."""
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t")], 0)
        async with broker.pool.acquire() as conn:
            before = await conn.fetchval("SHOW synchronous_commit")
            got = await conn.fetch(broker.query("claim"), ["default"], 1.0, 5, LEASE)
            after = await conn.fetchval("SHOW synchronous_commit")
    assert len(got) == 1
    assert before == after == "on"


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
        "emails.send",
        ["a@example.com"],
        {"subject": "hi"},
        "mail",
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


async def test_a_retry_due_soon_wakes_listeners_when_it_comes_due(url: str) -> None:
    """A snoozed job is announced with its run time: an idle worker in another process claims it
    when it comes due, not at its next poll (60 s here)."""
    async with PostgresBroker(url, poll_interval=60) as consumer, PostgresBroker(url) as producer:
        now = time.time()
        [jid] = await producer.enqueue([Job(task="t.noop")], now)
        [d] = await producer.reserve(["default"], 1, LEASE, 0, now)
        got: list[str] = []

        async def consume() -> None:
            claimed = await consumer.reserve(["default"], 1, LEASE, 10, time.time())
            got.extend(x.job_id for x in claimed)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                await anyio.sleep(0.2)  # the consumer found nothing and listens
                due = time.time() + 0.5
                snooze = Retry(due, "Throttled", charge_attempt=False)
                assert await producer.settle([(d.lease, snooze)], time.time()) == [True]
        assert got == [jid] and time.time() >= due


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
            "settle": (ids, tokens, ["ack"] * n, [None] * n, [None] * n, [True] * n, 0.0, 99, 5.0),
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


# -- cancel and progress -------------------------------------------------------------------------


async def test_cancel_racing_claims_either_cancels_or_reports_running(url: str) -> None:
    """Cancels and claims of the same jobs at once, on separate connections: a job is either
    cancelled (and never delivered) or delivered (and the cancel said RUNNING), never both."""
    n = 400
    async with PostgresBroker(url) as canceller, PostgresBroker(url) as claimer:
        ids = await claimer.enqueue([Job(task="t") for _ in range(n)], 0)
        answers: dict[str, JobState | None] = {}
        delivered: list[str] = []

        async def cancel_all() -> None:
            for job_id in reversed(ids):  # meet the claimer halfway
                answers[job_id] = await canceller.cancel(job_id, 100, 0)

        async def claim_all() -> None:
            while got := await claimer.reserve(["default"], 7, LEASE, 0, 0):
                delivered.extend(d.job_id for d in got)

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_all)
            tg.start_soon(claim_all)
        assert set(answers) == set(ids)
        assert {answers[i] for i in delivered} <= {JobState.RUNNING}
        cancelled = {i for i, s in answers.items() if s is JobState.CANCELLED}
        assert cancelled.isdisjoint(delivered) and len(cancelled) + len(delivered) == n
        assert 0 < len(cancelled) < n, "the two really raced"


async def test_a_cancelled_job_expires_with_the_kept_results(url: str) -> None:
    async with PostgresBroker(url) as broker:
        [jid] = await broker.enqueue([Job(task="t", dedupe_key="k")], 0)
        assert await broker.cancel(jid, 60, 0) is JobState.CANCELLED
        info = await broker.get_job(jid, 1)
        assert info is not None and info.finished_at == 0 and info.dedupe_key == "k"
        async with broker.pool.acquire() as conn:
            plan = await conn.fetch("EXPLAIN (COSTS OFF) " + broker.query("prune"), 1, 9, 0)
        assert "jobs_expiry_idx" in "\n".join(r[0] for r in plan)
        assert await broker.cancel(jid, 60, 60) is None, "expired, even before the prune"
        await broker.reclaim_expired(["default"], LEASE, 10, 61)
    assert await count_rows(url) == 0


async def test_progress_writes_are_fenced_by_the_lease_token(url: str) -> None:
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t")], 0)
        [d] = await broker.reserve(["default"], 1, LEASE, 0, 5)
        stale = type(d.lease)(d.job_id, "not-the-token", d.lease.queue)
        assert await broker.set_progress(stale, '{"x": 1}', 5) is False
        assert await broker.set_progress(d.lease, '{"x": 2}', 5) is True
        info = await broker.get_job(d.job_id, 5)
        assert info is not None and (info.progress, info.started_at) == ('{"x": 2}', 5)
        await broker.settle([(d.lease, Complete())], 6)
        assert await broker.set_progress(d.lease, '{"x": 3}', 6) is False


# -- the alert outbox and flow control ----------------------------------------------------------


async def alert_rows(url: str) -> list[asyncpg.Record]:
    conn = await connect_raw(url)
    try:
        return list(
            await conn.fetch(f'SELECT * FROM "{parse_url(url).schema}".alerts ORDER BY key')
        )
    finally:
        await conn.close()


async def test_one_settle_batch_merges_its_dead_jobs_per_alert_key(url: str) -> None:
    """One INSERT ... ON CONFLICT cannot touch a row twice: a batch with several dead jobs of one
    key (onto a row that is already pending) must count them all, and name the batch's last."""
    async with PostgresBroker(url) as broker:
        await broker.record_alert(
            AlertEvent("dead:default:t.a", "dead", "default", "t.a", "old", "E: old"), 0
        )
        jobs = [Job(task="t.a"), Job(task="t.b"), Job(task="t.a"), Job(task="t.a"), Job(task="t.c")]
        await broker.enqueue(jobs, 0)
        got = {d.job_id: d for d in await broker.reserve(["default"], 10, LEASE, 0, 0)}
        lost = got[jobs[4].id].lease
        stale = Lease(lost.job_id, "not-the-token", lost.queue)
        items = [(got[j.id].lease, DeadLetter(f"E: {j.id}")) for j in jobs[:4]]
        items.append((got[jobs[1].id].lease, DeadLetter("E: again")))  # a repeat: refused
        items.append((stale, DeadLetter("E: refused")))
        assert await broker.settle(items, 5) == [True, True, True, True, False, False]
        alerts = {a.key: a for a in await broker.list_alerts(pending_only=True, limit=10)}
    assert set(alerts) == {"dead:default:t.a", "dead:default:t.b"}
    a, b = alerts["dead:default:t.a"], alerts["dead:default:t.b"]
    assert (a.count, a.job_id, a.detail, a.first_at, a.last_at) == (
        4,
        jobs[3].id,
        f"E: {jobs[3].id}",
        0,
        5,
    )
    assert (b.count, b.job_id, b.detail) == (1, jobs[1].id, f"E: {jobs[1].id}")


async def test_concurrent_dead_letters_of_one_key_all_count(url: str) -> None:
    """Workers settling dead jobs of one task at once (a first alert row racing into existence,
    then updates) lose no event: ON CONFLICT waits for the other insert and merges."""
    brokers = [PostgresBroker(url) for _ in range(4)]
    try:
        for broker in brokers:
            await broker.connect()
        await brokers[0].enqueue([Job(task="t.flood") for _ in range(40)], 0)

        async def work(broker: PostgresBroker) -> None:
            while got := await broker.reserve(["default"], 3, LEASE, 0, 0):
                assert all(await broker.settle([(d.lease, DeadLetter("E")) for d in got], 0))

        async with anyio.create_task_group() as tg:
            for broker in brokers:
                tg.start_soon(work, broker)
        [alert] = await brokers[0].list_alerts(pending_only=True, limit=10)
    finally:
        for broker in brokers:
            await broker.close()
    assert (alert.key, alert.count) == ("dead:default:t.flood", 40)


async def test_a_dead_job_stored_without_a_task_name_is_alerted_by_its_payload(url: str) -> None:
    """A bare INSERT leaves the task column NULL: the alert key reads the payload, as the core's
    peek_task does; a payload naming no valid task is task '?'."""
    conn = await connect_raw(url)
    try:
        for payload in ('{"task": "t.raw"}', "not json", '{"task": "has space"}', '["x"]'):
            await conn.execute(
                f'INSERT INTO "{parse_url(url).schema}".jobs (payload, run_at) VALUES ($1, 0)',
                payload,
            )
    finally:
        await conn.close()
    async with PostgresBroker(url) as broker:
        bad = await broker.enqueue_raw("default", b"\xff{}", 0)
        got = await broker.reserve(["default"], 10, LEASE, 0, 0)
        assert len(got) == 5 and bad in {d.job_id for d in got}
        assert all(await broker.settle([(d.lease, DeadLetter("E")) for d in got], 0))
        alerts = {a.key: a.count for a in await broker.list_alerts(pending_only=True, limit=10)}
    assert alerts == {"dead:default:t.raw": 1, "dead:default:?": 4}


async def test_an_alert_keeps_at_most_the_detail_limit(url: str) -> None:
    async with PostgresBroker(url) as broker:
        await broker.enqueue([Job(task="t")], 0)
        [d] = await broker.reserve(["default"], 1, LEASE, 0, 0)
        await broker.settle([(d.lease, DeadLetter("é" * (ALERT_DETAIL_LIMIT + 10)))], 0)
        await broker.record_alert(
            AlertEvent("stall:default", "stall", "default", None, None, "ü" * 9000), 0
        )
        alerts = await broker.list_alerts(pending_only=True, limit=10)
        info = await broker.get_job(d.job_id, 0)
    assert [len(a.detail) for a in alerts] == [ALERT_DETAIL_LIMIT] * 2
    assert info is not None and info.last_error is not None
    assert len(info.last_error) == ALERT_DETAIL_LIMIT + 10, "the job keeps the whole error"


async def test_the_prune_drops_old_delivered_alerts_idle_rates_and_stale_slots(url: str) -> None:
    day = 86_400.0
    async with PostgresBroker(url) as broker:
        for key in ("stall:sent", "stall:pending"):
            await broker.record_alert(AlertEvent(key, "stall", "q", None, None, "x"), 0)
        [pending, sent] = sorted(await broker.claim_alerts(10, LEASE, 0), key=lambda a: a.key)
        assert await broker.finish_alert(sent, True, 600, None, 1)
        assert await broker.finish_alert(pending, False, 600, "HTTP 503", 1)
        assert await broker.acquire_rate("idle", 1.0, 0) == 0.0
        assert await broker.acquire_slot("k", "crashed", 5, 10.0, 0)
        await broker.reclaim_expired(["default"], LEASE, 10, 600 + day)  # a day not yet passed
        assert [r["key"] for r in await alert_rows(url)] == ["stall:pending", "stall:sent"]
        assert await broker.acquire_rate("fresh", 1.0, 600 + day) == 0.0
        assert await broker.acquire_slot("k2", "alive", 5, 10.0, 600 + day)
        await broker.reclaim_expired(["default"], LEASE, 10, 611 + day)  # the next prune
        assert [r["key"] for r in await alert_rows(url)] == ["stall:pending"]
        async with broker.pool.acquire() as conn:
            schema = parse_url(url).schema
            rates = await conn.fetch(f'SELECT key FROM "{schema}".rates')
            slots = await conn.fetch(f'SELECT key, holder FROM "{schema}".slots')
    assert [r["key"] for r in rates] == ["fresh"]
    assert [tuple(r) for r in slots] == [("k2", "alive")]


async def test_a_refused_rate_whose_snapshot_missed_the_grant_reads_it_again(url: str) -> None:
    """Racing first grants of one key: the losers' statement snapshot predates the winner's row
    (free_at NULL), so they read it again; every loser still gets the true wait."""
    brokers = [PostgresBroker(url) for _ in range(8)]
    waits: list[float] = []

    async def ask(broker: PostgresBroker) -> None:
        waits.append(await broker.acquire_rate("k", 10.0, 100.0))

    try:
        for broker in brokers:
            await broker.connect()
        async with anyio.create_task_group() as tg:
            for broker in brokers:
                tg.start_soon(ask, broker)
    finally:
        for broker in brokers:
            await broker.close()
    assert sorted(waits) == [0.0] + [10.0] * 7


async def test_a_slot_heartbeat_racing_an_acquire_is_counted(url: str) -> None:
    """acquire_slot locks the key's rows, so a heartbeat that commits while it waits is counted:
    the holder it kept alive is neither dropped nor joined past the limit (a count from the
    statement's snapshot alone would see it expired and admit a second holder)."""
    results: list[bool] = []
    async with PostgresBroker(url) as a, PostgresBroker(url) as b:
        assert await a.acquire_slot("k", "old", 1, 10.0, 0)

        async def acquire() -> None:
            results.append(await b.acquire_slot("k", "new", 1, 10.0, 50))

        conn = await connect_raw(url)
        try:
            heartbeat = conn.transaction()
            await heartbeat.start()
            await conn.execute(
                f'UPDATE "{parse_url(url).schema}".slots SET expires_at = 100 '
                "WHERE key = 'k' AND holder = 'old'"
            )
            async with anyio.create_task_group() as tg:
                tg.start_soon(acquire)
                await anyio.sleep(0.3)
                assert results == [], "the acquire waits for the heartbeat's row lock"
                await heartbeat.commit()
        finally:
            await conn.close()
        assert results == [False]
        assert not await b.acquire_slot("k", "new", 1, 10.0, 99)
        assert await b.acquire_slot("k", "new", 1, 10.0, 101)


async def test_the_new_statements_work_in_pgbouncer_mode(url: str) -> None:
    """prepared=0: unnamed statements only, so every parameter's type must be inferable."""
    async with PostgresBroker(f"{url}&listen=0&prepared=0") as broker:
        await broker.enqueue([Job(task="t")], 0)
        [d] = await broker.reserve(["default"], 1, LEASE, 0, 0)
        assert await broker.settle([(d.lease, DeadLetter("E"))], 0) == [True]
        await broker.record_alert(AlertEvent("stall:q", "stall", "q", None, None, "x"), 0)
        claimed = await broker.claim_alerts(10, LEASE, 0)
        assert len(claimed) == 2
        assert await broker.finish_alert(claimed[0], True, 600, None, 1)
        assert await broker.finish_alert(claimed[1], False, 5, "HTTP 503", 1)
        assert len(await broker.list_alerts(pending_only=False, limit=10)) == 2
        assert await broker.acquire_rate("r", 2.0, 0) == 0.0
        assert await broker.acquire_rate("r", 2.0, 1) == pytest.approx(1.0)
        assert await broker.acquire_slot("s", "h", 1, 10.0, 0)
        await broker.extend_slots([("s", "h")], 10.0, 5)
        await broker.release_slots([("s", "h")])
        assert (await broker.stats(0))["default"].oldest_ready_at is None
        await broker.reclaim_expired(["default"], LEASE, 10, 100_000)
        async with broker.pool.acquire() as conn:
            assert await conn.fetch("SELECT name FROM pg_prepared_statements") == []


# -- connection trouble (see also tests/process/test_postgres_restart.py) -------------------------


class _FailOnce:
    """Stands in for the broker's pool: the first ``fetch`` raises ``error``, as asyncpg does
    when it hands out a connection whose server went away before the driver noticed."""

    def __init__(self, pool: asyncpg.Pool, error: Exception) -> None:
        self.pool, self.error = pool, error

    def __getattr__(self, name: str) -> object:
        return getattr(self.pool, name)

    async def fetch(self, *args: object, **kwargs: object) -> object:
        self.fetch = self.pool.fetch  # type: ignore[method-assign]
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is ..."),
        asyncpg.AdminShutdownError("terminating connection due to administrator command"),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
    ids=["driver-lost-track", "admin-shutdown", "reset"],
)
async def test_a_broken_connection_is_unavailable_and_every_pooled_one_is_replaced(
    url: str, error: Exception
) -> None:
    async with PostgresBroker(url, pool_size=2) as broker:
        pool = broker.pool
        async with pool.acquire() as conn:
            before = conn.get_server_pid()
        broker._pool = _FailOnce(pool, error)
        try:
            with pytest.raises(BrokerUnavailable) as info:
                await broker.reserve(["default"], 1, LEASE, 0, 0)
            assert await broker.reserve(["default"], 1, LEASE, 0, 0) == [], "the next call works"
        finally:
            broker._pool = pool
        message = str(info.value)
        assert "is unavailable (reserve)" in message and "\n" not in message
        async with pool.acquire() as conn:
            assert conn.get_server_pid() != before, "the pooled connection was replaced"
