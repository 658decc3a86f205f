"""SQLite storage mechanics: expired rows leave the file, and files written by older versions
open and gain what they lack."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from brokers.sqlite import SCHEMA_VERSION, SqliteBroker
from taskkit.job import AlertEvent, Job, dead_alert_key
from taskkit.outcome import Complete, DeadLetter

pytestmark = pytest.mark.anyio
NOW = 1_800_000_000.0


async def test_the_recovery_pass_deletes_rows_whose_keep_time_is_up(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    now = NOW
    async with SqliteBroker(f"sqlite:///{path}") as broker:
        kept, cancelled = Job(task="t"), Job(task="t", run_at=now + 60)
        await broker.enqueue([kept, cancelled], now)
        [d] = await broker.reserve(["default"], 1, 30, 0, now)
        await broker.settle([(d.lease, Complete("1", keep_until=now + 100))], now)
        await broker.cancel(cancelled.id, now + 100, now)
        await broker.reclaim_expired(["default"], 30, 10, now + 50)
        assert _rows(path) == 2, "still inside their keep time"
        await broker.reclaim_expired(["default"], 30, 10, now + 101)
        assert _rows(path) == 0


async def test_the_recovery_pass_drops_idle_alerts_rates_and_expired_slots(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q.db"
    async with SqliteBroker(f"sqlite:///{path}") as broker:
        for key in ("stall:delivered", "stall:pending"):
            await broker.record_alert(_event(key), NOW)
        [delivered, _] = await broker.claim_alerts(2, 30, NOW)
        assert await broker.finish_alert(delivered, True, NOW + 600, None, NOW)
        assert await broker.acquire_slot("k", "dead-holder", 2, 30, NOW)
        assert await broker.acquire_slot("k", "live-holder", 2, 30, NOW)
        assert await broker.acquire_rate("task:gone", 10, NOW) == 0.0
        await broker.extend_slots([("k", "live-holder")], 30, NOW + 25)

        await broker.reclaim_expired(["default"], 30, 10, NOW + 31)
        assert _keys(path, "slots", "holder") == ["live-holder"]
        assert _keys(path, "alerts", "key") == ["stall:delivered", "stall:pending"]
        assert _keys(path, "rates", "key") == ["task:gone"]

        # A day past the end of its quiet window a delivered row goes; a pending one never does.
        await broker.reclaim_expired(["default"], 30, 10, NOW + 600 + 86_400 + 1)
        assert _keys(path, "alerts", "key") == ["stall:pending"]
        assert _keys(path, "slots", "holder") == []
        assert _keys(path, "rates", "key") == []
        # A new event on the dropped key starts afresh, as it would have on the old row.
        await broker.record_alert(_event("stall:delivered"), NOW + 90_000)
        claimed = {a.key: a for a in await broker.claim_alerts(10, 30, NOW + 90_000)}
        again = claimed["stall:delivered"]
        assert (again.count, again.first_at, again.sent_at) == (1, NOW + 90_000, None)


# The schema section of sqlite.sql as released: version 0 (the first release, no user_version)
# and version 1 (jobs.started_at and jobs.progress). Copied, not generated, so they stay put.
_V0_JOBS = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, queue TEXT NOT NULL, task TEXT,
    state TEXT NOT NULL, priority INTEGER NOT NULL DEFAULT 0, run_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER, payload TEXT NOT NULL,
    dedupe_key TEXT, lease_token TEXT, lease_until REAL, last_error TEXT, result TEXT,
    enqueued_at REAL NOT NULL, finished_at REAL, expires_at REAL
)"""
_V1_JOBS = _V0_JOBS.replace("finished_at REAL,", "started_at REAL, finished_at REAL,").replace(
    "expires_at REAL\n", "expires_at REAL, progress TEXT\n"
)
_OLD_INDEXES = [
    "CREATE INDEX jobs_claim ON jobs (queue, priority DESC, run_at, seq) WHERE state = 'pending'",
    "CREATE INDEX jobs_lease ON jobs (queue, lease_until) WHERE state = 'running'",
    "CREATE INDEX jobs_dead ON jobs (queue, finished_at) WHERE state = 'dead'",
    "CREATE INDEX jobs_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL",
    "CREATE UNIQUE INDEX jobs_dedupe ON jobs (dedupe_key)"
    " WHERE dedupe_key IS NOT NULL AND state IN ('pending', 'running')",
    "CREATE TABLE paused_queues (queue TEXT PRIMARY KEY)",
]


def _old_file(path: Path, version: int, job: Job) -> None:
    """A file as the version-``version`` broker left it, holding one pending ``job``."""
    with sqlite3.connect(path) as conn:
        conn.execute(_V0_JOBS if version == 0 else _V1_JOBS)
        for statement in _OLD_INDEXES:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.execute(
            "INSERT INTO jobs (id, queue, task, state, run_at, payload, enqueued_at)"
            " VALUES (?, 'default', ?, 'pending', ?, ?, ?)",
            (job.id, job.task, NOW, job.to_wire(), NOW),
        )
    conn.close()


@pytest.mark.parametrize("version", [0, 1])
async def test_a_file_from_an_older_version_gains_the_new_tables(
    tmp_path: Path, version: int
) -> None:
    path = tmp_path / "old.db"
    job = Job(task="t.boom")
    _old_file(path, version, job)
    async with SqliteBroker(f"sqlite:///{path}") as broker:
        assert _user_version(path) == SCHEMA_VERSION
        # The job written by the old version is delivered, and dies with its alert.
        [d] = await broker.reserve(["default"], 1, 30, 0, NOW)
        assert d.job_id == job.id
        assert await broker.settle([(d.lease, DeadLetter("E: boom"))], NOW) == [True]
        [alert] = await broker.list_alerts(pending_only=True, limit=10)
        assert (alert.key, alert.job_id) == (dead_alert_key("default", "t.boom"), job.id)
        assert await broker.acquire_rate("r", 1.0, NOW) == 0.0
        assert await broker.acquire_slot("s", "h", 1, 30, NOW)
        assert (await broker.stats(NOW))["default"].dead == 1


async def test_a_file_stamped_older_again_by_an_old_worker_still_opens(tmp_path: Path) -> None:
    # An old worker still running on the file stamps it back to version 1 when it reconnects;
    # the upgrade runs again and must keep every row.
    path = tmp_path / "q.db"
    url = f"sqlite:///{path}"
    async with SqliteBroker(url) as broker:
        await broker.record_alert(_event("stall:default"), NOW)
        assert await broker.acquire_slot("s", "h", 1, 30, NOW)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    async with SqliteBroker(url) as broker:
        assert _user_version(path) == SCHEMA_VERSION
        assert [a.key for a in await broker.list_alerts(False, 10)] == ["stall:default"]
        assert not await broker.acquire_slot("s", "other", 1, 30, NOW)


def _event(key: str) -> AlertEvent:
    return AlertEvent(key, "stall", "default", None, None, "waited")


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])


def _keys(path: Path, table: str, column: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute(f"SELECT {column} FROM {table} ORDER BY {column}")]


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
