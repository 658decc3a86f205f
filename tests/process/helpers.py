"""Run the real `taskkit` command in subprocesses, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.servers import wait_until

__all__ = ["wait_until"]

TASKKIT = [sys.executable, "-m", "taskkit.cli"]

# A task module for worker subprocesses: ledger.record(n) appends "<n> <pid>" to $LEDGER, after
# sleeping $LEDGER_SLEEP seconds (so restarts and kills land mid-drain). O_APPEND writes of one
# short line are atomic, so processes can share the ledger.
LEDGER_TASKS = """
import os, time
from taskkit import Router

router = Router()

@router.task(name="ledger.record")
def record(n: int) -> None:
    time.sleep(float(os.environ.get("LEDGER_SLEEP", "0")))
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND)
    os.write(fd, f"{n} {os.getpid()}\\n".encode())
    os.close(fd)
"""


def start_worker(
    app: str, url: str, cwd: Path, *args: str, worker_id: str, log: Path | None = None
) -> subprocess.Popen[str]:
    """Start `taskkit worker`; its output goes to a pipe, or to the file ``log``."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "TASKKIT_LOG_LEVEL": "INFO"}
    out = subprocess.PIPE if log is None else log.open("w")
    return subprocess.Popen(
        [*TASKKIT, "worker", app, "--broker", url, "--worker-id", worker_id, *args],
        cwd=cwd,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_cli(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [*TASKKIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def ledger_runs(ledger: Path) -> Counter[int]:
    """How often each job number appears in a ledger of ``<n> <pid>`` lines."""
    return Counter(int(line.split()[0]) for line in ledger.read_text().splitlines())


class Output:
    """Collects a process's output lines as they come (a thread per process), so the test can
    wait for a line while the process runs."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def close(self, timeout: float = 10) -> None:
        self._thread.join(timeout)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def notable(self) -> str:
        """Everything but the per-job lines and the DEBUG ones."""
        return "\n".join(
            ln for ln in list(self.lines) if "taskkit.job" not in ln and " DEBUG " not in ln
        )

    def claim_failures(self, about: str = "") -> int:
        """Failed claims so far (the first of an outage at ERROR, the retries at DEBUG)."""
        return sum("taskkit.worker: claim failed" in ln and about in ln for ln in list(self.lines))

    def outage_lines(self) -> list[str]:
        """What the worker logged above INFO, but for per-job lines (the broker being
        unreachable, refused settles)."""
        return [
            ln
            for ln in list(self.lines)
            if (" ERROR " in ln or " WARNING " in ln) and "taskkit.jobs" not in ln
        ]


def start_ledger_workers(
    count: int, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleep: float
) -> tuple[Path, list[subprocess.Popen[str]], list[Output]]:
    """``count`` workers on LEDGER_TASKS whose jobs take ``sleep`` seconds, with short leases
    and DEBUG logs (an outage's retries are DEBUG lines), and their collected output."""
    (tmp_path / "ledgertasks.py").write_text(LEDGER_TASKS)
    ledger = tmp_path / "ledger.txt"
    ledger.touch()
    monkeypatch.setenv("LEDGER", str(ledger))
    monkeypatch.setenv("LEDGER_SLEEP", str(sleep))
    # A short lease: a claim whose answer the restart swallowed is reclaimed within seconds.
    workers = [
        start_worker(
            "ledgertasks:router",
            url,
            tmp_path,
            "--concurrency",
            "4",
            "--lease",
            "4",
            "--log-level",
            "DEBUG",  # the retries of an outage are DEBUG lines: the test waits for them
            worker_id=f"w{i}",
        )
        for i in range(count)
    ]
    return ledger, workers, [Output(w) for w in workers]


def stop_workers(workers: list[subprocess.Popen[str]], outputs: list[Output]) -> list[int]:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    codes = []
    for w in workers:
        try:
            codes.append(w.wait(20))
        except subprocess.TimeoutExpired:
            w.kill()
            codes.append(w.wait(10))
    for o in outputs:
        o.close()
    return codes
