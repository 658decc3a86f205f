"""The chaos run with a server restart in the middle: SIGKILLed workers AND a Redis or
PostgreSQL restart, on servers the test owns. Nothing may be lost or completed twice."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from benchmarks.chaos import Report, run
from brokers.postgres import PostgresBroker
from tests.servers import ThrowawayPostgres, ThrowawayRedis

pytestmark = pytest.mark.anyio


def check(report: Report) -> None:
    table = report.table()
    assert report.runs_before_restart is not None, table
    assert 0 < report.runs_before_restart < report.enqueued, f"restart not mid-drain\n{table}"
    assert report.lost == 0, table
    assert report.completed_twice == 0, table
    assert report.completed == report.enqueued == 1200 and report.dead == 0, table


async def test_chaos_with_a_redis_restart(persistent_redis: ThrowawayRedis, tmp_path: Path) -> None:
    def restart() -> None:
        persistent_redis.stop()
        persistent_redis.start()

    url = persistent_redis.url + "?prefix=chaos"
    report = await anyio.to_thread.run_sync(
        lambda: run(
            url,
            jobs=1200,
            workers=3,
            kills=4,
            interval=0.7,
            lease=2.0,
            timeout=120,
            restart_server=restart,
            workdir=tmp_path,
            job_seconds=0.05,
        )
    )
    print(report.table())
    check(report)


async def test_chaos_with_a_postgres_restart(
    throwaway_postgres: ThrowawayPostgres, tmp_path: Path
) -> None:
    url = throwaway_postgres.url + "?schema=chaos"
    await PostgresBroker(url).migrate()

    def restart() -> None:
        throwaway_postgres.stop("fast")
        throwaway_postgres.start()

    report = await anyio.to_thread.run_sync(
        lambda: run(
            url,
            jobs=1200,
            workers=3,
            kills=4,
            interval=0.7,
            lease=2.0,
            timeout=120,
            restart_server=restart,
            workdir=tmp_path,
            job_seconds=0.05,
        )
    )
    print(report.table())
    check(report)
