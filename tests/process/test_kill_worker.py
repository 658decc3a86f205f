"""A worker process is SIGKILLed in the middle of a job; another worker, under another id,
finishes that job once the lease runs out. Nothing is lost and the job ran at most twice."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path

import pytest

from tests.backends import BrokerSpace

from .helpers import run_cli, start_worker, wait_until

pytestmark = pytest.mark.anyio

TASKS = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    from taskkit import Router

    router = Router()
    LEDGER = Path(os.environ.get("LEDGER", "ledger.txt"))

    @router.task(name="slow.work", keep_result=600)
    def work(n: int) -> int:
        with LEDGER.open("a") as f:
            f.write(f"start {n} {os.getpid()}\\n")
        time.sleep(1.5)
        with LEDGER.open("a") as f:
            f.write(f"done {n} {os.getpid()}\\n")
        return n
    """
)


async def test_a_killed_workers_job_is_finished_by_another_worker(
    server_space: BrokerSpace, tmp_path: Path
) -> None:
    assert server_space.url is not None
    url = server_space.url
    (tmp_path / "killtasks.py").write_text(TASKS)
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    enq = run_cli(
        tmp_path, "enqueue", "killtasks:router", "slow.work", "--args", "[7]", "--broker", url
    )
    assert enq.returncode == 0, enq.stderr
    job_id = enq.stdout.strip()

    first = start_worker("killtasks:router", url, tmp_path, "--lease", "1", worker_id="first")
    try:
        wait_until(lambda: "start 7" in ledger.read_text(), 30, "the first worker to start the job")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert "done" not in ledger.read_text()

    second = start_worker(
        "killtasks:router", url, tmp_path, "--lease", "1", "--burst", worker_id="second"
    )
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0, out

    lines = ledger.read_text().splitlines()
    assert [ln.split()[0] for ln in lines] == ["start", "start", "done"], lines
    assert lines[1].split()[2] == lines[2].split()[2] == str(second.pid)
    info = run_cli(tmp_path, "info", "--json", "--broker", url)
    assert info.returncode == 0, info.stderr
    assert (
        '"running": 0' in info.stdout and '"ready": 0' in info.stdout and '"dead": 0' in info.stdout
    )
    assert f"job {job_id} recovered" in out and "lease ran out; requeued" in out
