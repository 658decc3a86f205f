"""The chaos run with a server restart in the middle: SIGKILLed workers AND a Redis or
PostgreSQL restart, on servers the test owns. Nothing may be lost or completed twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from benchmarks.chaos import run
from brokers.postgres import PostgresBroker
from tests.servers import ThrowawayPostgres, ThrowawayRedis

pytestmark = pytest.mark.anyio


async def _server(kind: str, request: pytest.FixtureRequest) -> tuple[str, Callable[[], None]]:
    """The URL of a server the test owns, and how to restart it."""
    server: ThrowawayRedis | ThrowawayPostgres
    if kind == "redis":
        server = request.getfixturevalue("persistent_redis")  # appendfsync always
        url = server.url + "?prefix=chaos"
    else:
        server = request.getfixturevalue("throwaway_postgres")
        url = server.url + "?schema=chaos"
        await PostgresBroker(url).migrate()

    def restart() -> None:
        server.stop()  # redis: SIGTERM (AOF flushed); postgres: pg_ctl stop -m fast
        server.start()

    return url, restart


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_chaos_with_a_server_restart(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, restart = await _server(kind, request)
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
    table = report.table()
    assert report.runs_before_restart is not None, table
    assert 0 < report.runs_before_restart < report.enqueued, f"restart not mid-drain\n{table}"
    assert report.passed, table  # lost == 0 and completed twice == 0
    assert report.completed == report.enqueued == 1200 and report.dead == 0, table
