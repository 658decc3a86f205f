"""Three worker processes share a 1-second periodic task: each tick runs once, none is skipped."""

from __future__ import annotations

import itertools
import signal
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.backends import BrokerSpace

from .helpers import run_cli, start_worker, wait_until

pytestmark = pytest.mark.anyio

TASKS = textwrap.dedent(
    """
    import os, time
    from taskkit import Router, current_job

    router = Router()

    @router.task(name="tick.record", every=1)
    def record() -> None:
        fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND)
        os.write(fd, f"{current_job().id} {time.time():.3f} {os.getpid()}\\n".encode())
        os.close(fd)
    """
)


async def test_each_tick_runs_once_across_workers(
    server_space: BrokerSpace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server_space.url is not None
    (tmp_path / "ticktasks.py").write_text(TASKS)
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    monkeypatch.setenv("LEDGER", str(ledger))
    listed = run_cli(tmp_path, "schedule", "list", "ticktasks:router")
    assert "tick.record  every 1s  queue=default  next=" in listed.stdout, listed.stderr
    workers = [
        start_worker(
            "ticktasks:router",
            server_space.url,
            tmp_path,
            worker_id=f"w{i}",
            log=tmp_path / f"w{i}.log",
        )
        for i in range(3)
    ]
    try:
        wait_until(lambda: ledger.read_text().count("\n") >= 6, 60, "six ticks")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        assert [w.wait(30) for w in workers] == [0, 0, 0]
    rows = [line.split() for line in ledger.read_text().splitlines()]
    assert max(Counter(r[0] for r in rows).values()) == 1, "a tick ran twice"
    times = sorted(float(r[1]) for r in rows)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g < 1.9 for g in gaps[1:]), f"a tick was skipped: {gaps}"
    assert time.time() - times[-1] < 60
