"""The task and the ledger of the chaos run (benchmarks/chaos.py).

The ledger is a file the broker knows nothing of: ``run <job id>`` for every execution the task
finished, ``ack <job id>`` for every completion the broker accepted. Lines are written with one
O_APPEND write each, so processes can share the file without tearing lines.
"""

from __future__ import annotations

import os
import time

from taskkit import Router, current_job
from taskkit.middleware import Middleware
from taskkit.outcome import Complete, Outcome


def _append(line: str) -> None:
    fd = os.open(os.environ["CHAOS_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class AckLedger(Middleware):
    def on_settled(self, job_id: str, outcome: Outcome, applied: bool) -> None:
        if applied and isinstance(outcome, Complete):
            _append(f"ack {job_id}\n")


_SECONDS = float(os.environ["CHAOS_JOB_SECONDS"]) if "CHAOS_JOB_SECONDS" in os.environ else None

router = Router()
router.use(AckLedger())


@router.task(name="chaos.record", max_attempts=25, keep_result=86_400)
def record(n: int) -> None:
    time.sleep(_SECONDS if _SECONDS is not None else 0.002 + (n % 7) * 0.002)  # kills land mid-job
    _append(f"run {current_job().id}\n")
