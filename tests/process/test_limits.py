"""Limits across worker processes on a real broker: a rate shared by three processes, and the
concurrency slot of a worker killed with SIGKILL coming back when its lease runs out."""

from __future__ import annotations

import itertools
import signal
import textwrap
from pathlib import Path

import pytest

from taskkit import App
from taskkit.job import Job
from tests.backends import BrokerSpace

from .helpers import Output, start_worker, stop_workers, wait_until

pytestmark = pytest.mark.anyio

# record(n) writes "<n> <pid> <time>" to $LEDGER; hold(n, s) sleeps s seconds first.
TASKS = textwrap.dedent(
    """
    import os, time
    from taskkit import Router

    router = Router()

    def _write(n):
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND)
        os.write(fd, f"{n} {os.getpid()} {time.time()}\\n".encode())
        os.close(fd)

    @router.task(name="api.call", rate_limit="4/s", max_attempts=1)
    def call(n: int) -> None:
        _write(n)

    @router.task(name="render.video", concurrency=1, max_attempts=1)
    def render(n: int, seconds: float) -> None:
        _write(n)
        time.sleep(seconds)
        _write(-n)
    """
)


def ledger(path: Path) -> list[tuple[int, int, float]]:
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(int(n), int(pid), float(t)) for n, pid, t in rows]


def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "limittasks.py").write_text(TASKS)
    path = tmp_path / "ledger.txt"
    path.touch()
    monkeypatch.setenv("LEDGER", str(path))
    return path


async def test_three_worker_processes_share_one_rate_limit(
    server_space: BrokerSpace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server_space.url is not None
    path = setup(tmp_path, monkeypatch)
    async with App(None, server_space.make()) as app:
        await app.enqueue_jobs([Job(task="api.call", args=[n]) for n in range(10)])
    workers = [
        start_worker("limittasks:router", server_space.url, tmp_path, worker_id=f"r{i}")
        for i in range(3)
    ]
    outputs = [Output(w) for w in workers]
    try:
        wait_until(lambda: len(ledger(path)) >= 10, 60, "10 rate-limited runs")
    finally:
        codes = stop_workers(workers, outputs)
    rows = ledger(path)
    assert sorted(n for n, _, _ in rows) == list(range(10))  # each once: snoozes lost nothing
    assert len({pid for _, pid, _ in rows}) >= 2, "the runs should spread over the processes"
    times = sorted(t for _, _, t in rows)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.25 - 0.05, gaps  # 4/s: one run per 0.25 s, whichever process
    assert codes == [0, 0, 0], "\n".join(o.notable() for o in outputs)


async def test_a_killed_workers_concurrency_slot_comes_back(
    server_space: BrokerSpace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server_space.url is not None
    path = setup(tmp_path, monkeypatch)
    async with App(None, server_space.make()) as app:
        await app.enqueue_jobs([Job(task="render.video", args=[1, 120])])
        first = start_worker(
            "limittasks:router",
            server_space.url,
            tmp_path,
            "--lease",
            "2",
            "--log-level",
            "DEBUG",  # throttled jobs are DEBUG lines
            worker_id="doomed",
        )
        first_out = Output(first)
        wait_until(lambda: [n for n, _, _ in ledger(path)] == [1], 30, "job 1 to start")
        await app.enqueue_jobs([Job(task="render.video", args=[2, 0])])
        # While job 1 holds the fleet's only slot, job 2 is snoozed, not run.
        wait_until(lambda: "throttled" in first_out.text, 30, "job 2 to be throttled")
        assert [n for n, _, _ in ledger(path)] == [1]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        first_out.close()
        second = start_worker(
            "limittasks:router", server_space.url, tmp_path, "--lease", "2", worker_id="heir"
        )
        second_out = Output(second)
        try:
            # The slot's lease runs out (2 s after the last heartbeat) and job 2 gets it.
            wait_until(lambda: -2 in [n for n, _, _ in ledger(path)], 60, "job 2 to run")
        finally:
            codes = stop_workers([second], [second_out])
    runs = ledger(path)
    assert [n for n, pid, _ in runs if pid == second.pid] == [2, -2]
    assert codes == [0], second_out.notable()
