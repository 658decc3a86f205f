"""Redis restarts under draining worker processes (issue: connection trouble).

The tests own their server: ``ThrowawayRedis`` runs ``redis-server`` on a free port of 127.0.0.1
with its data in a fresh temporary directory, so it can stop and start it at will without
disturbing the shared test server. Stopping is SIGTERM and waiting for the process to exit (what
``redis-cli shutdown`` does): with ``appendonly yes`` Redis writes and fsyncs its AOF first.

- With persistence (``--appendonly yes --appendfsync always``): while two workers drain 300 jobs
  the server goes down, stays down until every worker has retried its claim three times (the
  later tries refused reconnections), and comes back on the same port with the same directory.
  Every job must have run (some may have run twice: at-least-once), nothing may be left ready,
  scheduled or running, and the workers must still be serving.
- Without persistence (``--appendonly no --save ""``, as this machine's Redis runs): the restart
  loses the queue, which is expected; the worker must survive it and drain the jobs enqueued
  after the restart.
- Frozen (SIGSTOP, then SIGCONT): connections stay open and nothing answers; every call must
  give up after the socket timeout instead of hanging, and the drain must finish after the thaw.

Each time the workers must be back waiting in BLMOVE afterwards (CLIENT LIST shows them blocked),
and their logs must hold one ERROR line per loop and outage, no traceback.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
import pytest

from brokers.redis import RedisBroker
from taskkit import App, Job
from tests.servers import ThrowawayRedis

from .helpers import Output, ledger_runs, run_cli, start_ledger_workers, stop_workers, wait_until

pytestmark = pytest.mark.slow

# -- a Redis server owned by the test ------------------------------------------------------------


# -- worker processes ----------------------------------------------------------------------------


JOBS = 300
PREFIX = "restart"


async def _enqueue(url: str, numbers: range) -> None:
    async with App(None, RedisBroker(url)) as app:
        await app.enqueue_jobs([Job(task="ledger.record", args=[i]) for i in numbers])


def enqueue(url: str, numbers: range) -> None:
    anyio.run(_enqueue, url, numbers)


def left_in_queues(cwd: Path, url: str) -> dict[str, dict[str, int]]:
    """``taskkit info --json``: per queue, what is ready, scheduled, running or dead."""
    info = run_cli(cwd, "info", "--json", "--broker", url)
    assert info.returncode == 0, info.stderr
    queues: dict[str, dict[str, int]] = json.loads(info.stdout)["queues"]
    return queues


def idle(cwd: Path, url: str) -> bool:
    return all(
        (q["ready"], q["scheduled"], q["running"]) == (0, 0, 0)
        for q in left_in_queues(cwd, url).values()
    )


def drain_after_outage(
    server: ThrowawayRedis,
    workers: list[subprocess.Popen[str]],
    ledger: Path,
    cwd: Path,
    url: str,
    after: str,
) -> None:
    """Once the server answers again: every job runs and is acknowledged, both workers are
    back waiting in BLMOVE, and neither died."""

    def drained() -> bool:
        return len(ledger_runs(ledger)) == JOBS and idle(cwd, url)

    wait_until(drained, 25, f"every job to run and be acknowledged after {after}")
    wait_until(lambda: server.clients_waiting_in_blmove() >= 2, 10, "both to wait in BLMOVE")
    assert [w.poll() for w in workers] == [None, None], "a worker died (see its log below)"


def check_outage_lines(outputs: list[Output], noticed: list[list[str]], port: int) -> None:
    """No traceback; one readable ERROR line per loop and outage, naming the server; every line
    above INFO is about the outage or its at-least-once aftermath (a lease that ran out meanwhile,
    a settle refused because the job was taken over); and the claim loop says when Redis answers
    again."""
    expected = ("is unavailable:", "refused: lease lost", "lease ran out; requeued")
    for i, (o, lines) in enumerate(zip(outputs, noticed, strict=True)):
        print(f"--- worker w{i}, per-job and DEBUG lines left out:\n{o.notable()}")
        assert "Traceback" not in o.text, "no traceback (the log is printed above)"
        assert any("unavailable" in ln and f"127.0.0.1:{port}" in ln for ln in lines), lines
        unexpected = [ln for ln in o.outage_lines() if not any(e in ln for e in expected)]
        assert unexpected == [], unexpected
        for loop in ("claim", "settle", "heartbeat", "recovery"):
            errors = [ln for ln in o.lines if f"ERROR taskkit.worker: {loop} failed" in ln]
            assert len(errors) <= 1, f"one ERROR line per outage, not {errors}"
        assert sum("ERROR taskkit.worker: claim failed" in ln for ln in o.lines) == 1
        assert any("taskkit.worker: claim works again after" in ln for ln in o.lines)


# -- the tests -----------------------------------------------------------------------------------


def test_workers_survive_a_redis_restart_and_lose_no_job_redis_kept(
    persistent_redis: ThrowawayRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = persistent_redis
    url = f"{server.url}?prefix={PREFIX}"
    enqueue(url, range(JOBS))
    ledger, workers, outputs = start_ledger_workers(2, url, tmp_path, monkeypatch, sleep=0.03)
    try:
        wait_until(lambda: len(ledger_runs(ledger)) >= 40, 20, "the drain to start")
        server.stop()
        down_at = time.monotonic()
        # Down until every worker's claim loop has failed three times, the last ones refused
        # reconnections (backing off between tries: 0.2 s, 0.4 s, ...).
        wait_until(
            lambda: all(
                o.claim_failures() >= 3 and o.claim_failures("connecting") for o in outputs
            ),
            15,
            "each worker to retry its claims during the outage",
        )
        noticed = [o.outage_lines() for o in outputs]
        assert len(ledger_runs(ledger)) < JOBS, "the outage hit mid-drain"
        server.start()
        outage = time.monotonic() - down_at
        drain_after_outage(server, workers, ledger, tmp_path, url, "the restart")
    finally:
        codes = stop_workers(workers, outputs)
    assert codes == [0, 0], [o.notable() for o in outputs]

    runs = ledger_runs(ledger)
    assert sorted(runs) == list(range(JOBS)), "every job ran"
    queues = left_in_queues(tmp_path, url)
    assert list(queues) == ["default"], queues
    assert queues["default"]["dead"] == 0, queues
    check_outage_lines(outputs, noticed, server.port)
    twice = sum(runs.values()) - JOBS
    print(f"outage {outage:.1f}s; {twice} job(s) ran twice (at-least-once)")


def test_a_worker_survives_a_restart_that_loses_everything_and_drains_new_jobs(
    volatile_redis: ThrowawayRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = volatile_redis
    url = f"{server.url}?prefix={PREFIX}"
    enqueue(url, range(100))
    ledger, workers, outputs = start_ledger_workers(1, url, tmp_path, monkeypatch, sleep=0.03)
    try:
        wait_until(lambda: len(ledger_runs(ledger)) >= 10, 20, "the drain to start")
        server.stop()
        wait_until(
            lambda: all(o.claim_failures() >= 3 for o in outputs), 15, "the claims to be retried"
        )
        noticed = [o.outage_lines() for o in outputs]
        server.start()  # empty: the queue, the leases and the scripts are gone
        before = ledger_runs(ledger)
        assert len(before) < 100, "the outage hit mid-drain"
        enqueue(url, range(1000, 1100))

        def drained() -> bool:
            runs = ledger_runs(ledger)
            return all(n in runs for n in range(1000, 1100)) and idle(tmp_path, url)

        wait_until(drained, 25, "the jobs enqueued after the restart to run")
        wait_until(lambda: server.clients_waiting_in_blmove() >= 1, 10, "a wait in BLMOVE")
        assert [w.poll() for w in workers] == [None], "the worker died (see its log below)"
    finally:
        codes = stop_workers(workers, outputs)
    assert codes == [0], [o.notable() for o in outputs]
    runs = ledger_runs(ledger)
    assert max(runs[n] for n in range(1000, 1100)) == 1, "new jobs ran once each"
    check_outage_lines(outputs, noticed, server.port)
    lost = sum(1 for n in range(100) if n not in runs)
    print(f"{lost} of the 100 jobs enqueued before the restart were lost with the data")


def test_workers_time_out_of_a_frozen_server_and_carry_on_when_it_thaws(
    persistent_redis: ThrowawayRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGSTOP: sockets stay open and nothing answers, the case a closed connection does not
    cover. Every call, BLMOVE included, must give up after the socket timeout (5 s by default)."""
    server = persistent_redis
    url = f"{server.url}?prefix={PREFIX}"
    enqueue(url, range(JOBS))
    ledger, workers, outputs = start_ledger_workers(2, url, tmp_path, monkeypatch, sleep=0.03)
    try:
        wait_until(lambda: len(ledger_runs(ledger)) >= 40, 20, "the drain to start")
        server.freeze()
        try:
            wait_until(
                lambda: all(o.claim_failures("Timeout") for o in outputs),
                20,
                "each worker's claim to time out",
            )
        finally:
            server.thaw()
        noticed = [o.outage_lines() for o in outputs]
        assert len(ledger_runs(ledger)) < JOBS, "the freeze hit mid-drain"
        drain_after_outage(server, workers, ledger, tmp_path, url, "the thaw")
    finally:
        codes = stop_workers(workers, outputs)
    assert codes == [0, 0], [o.notable() for o in outputs]
    runs = ledger_runs(ledger)
    assert sorted(runs) == list(range(JOBS)), "every job ran"
    check_outage_lines(outputs, noticed, server.port)
    print(f"{sum(runs.values()) - JOBS} job(s) ran twice (at-least-once)")
