"""PostgreSQL restarts under two draining worker processes (issue: connection trouble).

The test owns its server: ``ThrowawayPostgres`` runs initdb and pg_ctl on a free port (as the
``postgres`` user when the test runs as root, since PostgreSQL refuses root), so it can stop and
start it at will without disturbing the shared test server. While two workers drain 300 jobs the
server goes down (``pg_ctl stop -m fast``, or ``-m immediate`` like a crash: every connection,
LISTEN included, is cut), stays down until each worker's claims have failed three times, and
comes back. Then every job must have run, nothing may be left pending or running, both workers
must LISTEN again and still be serving (a job enqueued afterwards runs), and what they logged
about the outage must be readable single lines, not tracebacks.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from brokers.postgres import PostgresBroker, parse_url
from taskkit import App, Job
from tests.servers import ThrowawayPostgres

from .helpers import (
    ledger_runs,
    run_cli,
    start_ledger_workers,
    stop_workers,
    wait_until,
)

pytestmark = pytest.mark.slow


# -- worker processes ----------------------------------------------------------------------------


JOBS = 300


async def _enqueue(url: str, n: int) -> None:
    async with App(None, PostgresBroker(url)) as app:
        await app.enqueue_jobs([Job(task="ledger.record", args=[i]) for i in range(n)])


async def _enqueue_one(url: str, n: int) -> None:
    async with App(None, PostgresBroker(url)) as app:
        await app.enqueue_jobs([Job(task="ledger.record", args=[n])])


async def _fetch(url: str, query: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(parse_url(url).dsn)
    try:
        return [tuple(r) for r in await conn.fetch(query)]
    finally:
        await conn.close()


def sql(url: str, query: str) -> list[tuple[Any, ...]]:
    """Run one query on a connection of its own (the test's view, not a worker's)."""
    return anyio.run(_fetch, url, query)


def rows_by_state(url: str) -> dict[str, int]:
    """The schema's jobs by state; empty once every job has been acknowledged."""
    table = f'"{parse_url(url).schema}".jobs'
    return dict(sql(url, f"SELECT state, count(*) FROM {table} GROUP BY state"))


def listening_connections(url: str) -> int:
    """Connections whose last statement was a LISTEN on this schema's channel: the workers'
    listeners (asyncpg runs nothing else on them)."""
    listen = f'LISTEN "{parse_url(url).channel}"'
    [(n,)] = sql(url, f"SELECT count(*) FROM pg_stat_activity WHERE query = '{listen}'")
    return int(n)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_workers_survive_a_server_restart_and_lose_no_job(
    mode: str,
    throwaway_postgres: ThrowawayPostgres,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``fast``: the server rolls back open transactions and says goodbye to every connection.
    ``immediate``: it dies without a word, like a crash, and replays its WAL when it starts."""
    server = throwaway_postgres
    url = f"{server.url}?schema=restart"
    migrated = run_cli(tmp_path, "migrate", "--broker", url)
    assert migrated.returncode == 0, migrated.stderr
    anyio.run(_enqueue, url, JOBS)

    ledger, workers, outputs = start_ledger_workers(2, url, tmp_path, monkeypatch, sleep=0.05)
    try:
        wait_until(lambda: listening_connections(url) == 2, 10, "both workers to LISTEN")
        wait_until(lambda: len(ledger.read_text().splitlines()) >= 40, 20, "the drain to start")
        assert not any(o.outage_lines() for o in outputs), "no trouble before the outage"
        server.stop(mode)
        down_at = time.monotonic()
        # Down until every worker's claim loop has failed three times (backing off between
        # tries: 0.2 s, 0.4 s, ...), however long that takes.
        wait_until(
            lambda: all(o.claim_failures() >= 3 for o in outputs),
            15,
            "each worker to retry its claims during the outage",
        )
        noticed = [o.outage_lines() for o in outputs]
        assert len(ledger_runs(ledger)) < JOBS, "the outage hit mid-drain"
        server.start()
        outage = time.monotonic() - down_at

        def drained() -> bool:
            return len(ledger_runs(ledger)) == JOBS and rows_by_state(url) == {}

        wait_until(drained, 20, "every job to run and be acknowledged after the restart")
        wait_until(lambda: listening_connections(url) == 2, 10, "both workers to LISTEN again")
        exited = [w.poll() for w in workers]
        assert exited == [None, None], "a worker died (its log is printed below)"
        anyio.run(_enqueue_one, url, JOBS)
        wait_until(lambda: JOBS in ledger_runs(ledger), 10, "a job enqueued after the restart")
    finally:
        codes = stop_workers(workers, outputs)
        for i, o in enumerate(outputs):
            print(f"--- worker w{i} (exit {codes[i]}), per-job lines left out:\n{o.notable()}")
    logs = [o.text for o in outputs]
    assert codes == [0, 0], "a worker did not stop cleanly (its log is printed below)"

    runs = ledger_runs(ledger)
    assert sorted(runs) == list(range(JOBS + 1)), "every job ran"
    info = run_cli(tmp_path, "info", "--json", "--broker", url)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["queues"] == {}, "nothing pending, running or dead"
    expected = ("is unavailable (", "cannot LISTEN on", "refused: lease lost")
    for o, log, lines in zip(outputs, logs, noticed, strict=True):
        assert "Traceback" not in log, "no traceback (the log is printed below)"
        # One readable line: it says what is wrong, on which server (no password to hide here).
        assert any("unavailable" in ln and f"127.0.0.1:{server.port}" in ln for ln in lines), lines
        unexpected = [ln for ln in o.outage_lines() if not any(e in ln for e in expected)]
        assert unexpected == [], unexpected
        errors = [ln for ln in log.splitlines() if "ERROR taskkit.worker: claim failed" in ln]
        assert len(errors) == 1, f"one ERROR line per outage, not {len(errors)}"
        assert "taskkit.worker: claim works again after" in log
    print(f"outage {outage:.1f}s; {sum(runs.values()) - len(runs)} job(s) ran twice")
    for lines in noticed:
        print("\n".join(lines[:3]))
