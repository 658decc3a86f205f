"""The chaos run with a server restart in the middle: SIGKILLed workers AND a Redis or
PostgreSQL restart, on servers the test owns. Nothing may be lost or completed twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from benchmarks.chaos import Report, run
from brokers.postgres import PostgresBroker
from tests.servers import ThrowawayPostgres, ThrowawayRedis

pytestmark = pytest.mark.anyio


@pytest.fixture
def redis_server() -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis(persistent=True)  # appendonly yes, appendfsync always
    try:
        server.start()
        yield server
    finally:
        server.destroy()


@pytest.fixture
def postgres_server() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.destroy()


def check(report: Report) -> None:
    table = report.table()
    assert report.runs_before_restart is not None, table
    assert 0 < report.runs_before_restart < report.enqueued, f"restart not mid-drain\n{table}"
    assert report.lost == 0, table
    assert report.completed_twice == 0, table
    assert report.completed == report.enqueued == 1200 and report.dead == 0, table


async def test_chaos_with_a_redis_restart(redis_server: ThrowawayRedis, tmp_path: Path) -> None:
    def restart() -> None:
        redis_server.stop()
        redis_server.start()

    url = redis_server.url + "?prefix=chaos"
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
    postgres_server: ThrowawayPostgres, tmp_path: Path
) -> None:
    url = postgres_server.url + "?schema=chaos"
    await PostgresBroker(url).migrate()

    def restart() -> None:
        postgres_server.stop("fast")
        postgres_server.start()

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
