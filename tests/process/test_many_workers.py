"""Several worker processes drain one queue together: every job runs exactly once."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest

from taskkit import App, Job
from tests.backends import BrokerSpace

from .helpers import LEDGER_TASKS, run_cli, start_worker, wait_until

pytestmark = pytest.mark.anyio


async def test_three_workers_share_one_queue_without_running_a_job_twice(
    server_space: BrokerSpace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert server_space.url is not None
    (tmp_path / "ledgertasks.py").write_text(LEDGER_TASKS)
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    monkeypatch.setenv("LEDGER", str(ledger))
    monkeypatch.setenv("LEDGER_SLEEP", "0.005")  # restarts and kills land mid-drain
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    workers = [
        start_worker(
            "ledgertasks:router",
            server_space.url,
            tmp_path,
            "--concurrency",
            "4",
            worker_id=f"w{i}",
            log=logs[i],
        )
        for i in range(3)
    ]
    try:
        for log in logs:  # all three wait for work before any arrives
            wait_until(lambda log=log: "starting" in log.read_text(), 30, f"{log.name} to start")
        n = 300
        async with App(None, server_space.make()) as app:
            await app.enqueue_jobs([Job(task="ledger.record", args=[i]) for i in range(n)])
        wait_until(lambda: ledger.read_text().count("\n") >= n, 120, "every job to run")
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        codes = [w.wait(30) for w in workers]
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for log in logs]

    lines = ledger.read_text().splitlines()
    runs = Counter(int(line.split()[0]) for line in lines)
    assert sorted(runs) == list(range(n)), "every job ran"
    assert max(runs.values()) == 1, "no job ran twice"
    assert len({line.split()[1] for line in lines}) >= 2, "the work was shared"
    info = run_cli(tmp_path, "info", "--json", "--broker", server_space.url)
    left = json.loads(info.stdout)["queues"].get("default", {"ready": 0, "running": 0})
    assert (left["ready"], left["running"]) == (0, 0)
