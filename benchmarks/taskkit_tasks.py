"""taskkit's side of the workload: the router the ``taskkit worker`` subprocesses serve
(``benchmarks.taskkit_tasks:router``)."""

from __future__ import annotations

from benchmarks.workload import mark_started, record_latency
from taskkit import Router

router = Router()


@router.task(name="bench.noop")
async def noop() -> None:
    mark_started()


@router.task(name="bench.stamp")
async def stamp(enqueued: float) -> None:
    record_latency(enqueued)
