"""SQLite storage mechanics: expired kept results and cancelled jobs leave the file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from brokers.sqlite import SqliteBroker
from taskkit.job import Job
from taskkit.outcome import Complete

pytestmark = pytest.mark.anyio


async def test_the_recovery_pass_deletes_rows_whose_keep_time_is_up(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    now = 1_800_000_000.0
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


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])
