"""Run the real `taskkit` command in subprocesses, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

TASKKIT = [sys.executable, "-m", "taskkit.cli"]


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


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
