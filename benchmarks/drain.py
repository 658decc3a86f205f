"""Drain: N no-op jobs already queued, worker processes started, time to the last ack.

Timed from the first job's start (the task writes it to a marker file, once) to the first poll of
the system's own count of unacknowledged jobs that finds none (taskkit: ``broker.stats``; a
peer: the length of its queue and of its in-flight set), or the exit of every worker in burst
mode, whichever comes first. Polls come every 20 ms near the end (that is the resolution) and
sparingly before. No round trip per job is added. The same method for every system: taskkit's
burst exit alone would add its final 0.2 s claim wait and its shutdown to its time. Worker
start-up (interpreter, imports, connecting) is reported apart, as ``startup_s``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import anyio

from benchmarks.common import (
    Figure,
    Options,
    WorkerProcess,
    progress,
    read_mark,
    scratch,
    worker_env,
)
from benchmarks.system import System
from benchmarks.workload import MARK_ENV

POLL = 0.02  # the shortest pause between two polls: the resolution of the end time
MAX_POLL = 1.0


async def _wait_drained(
    system: System, procs: list[WorkerProcess], jobs: int, timeout: float
) -> float:
    """The wall time the queue was first seen drained (or every burst worker had exited 0).

    Polls sparingly while much is left (the pause is half the time the rate so far says the
    rest will take, at most 1 s) and every 20 ms near the end: a poll is a query the server and
    this process pay for while the worker runs (a count over the jobs table on SQLite and
    PostgreSQL), so polling every 20 ms throughout would slow the system being measured."""
    deadline = time.monotonic() + timeout
    t0, left = time.monotonic(), jobs
    while True:
        codes = [p.exited() for p in procs]
        failed = next((p for p, c in zip(procs, codes, strict=True) if c), None)
        if failed is not None:
            raise failed.failure(f"{system.name} drain")
        if all(c == 0 for c in codes):  # every burst worker found the queue empty itself
            return time.time()
        left = await system.pending()
        if left == 0:
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{system.name} drain: {left} jobs left after {timeout}s")
        done, elapsed = jobs - left, time.monotonic() - t0
        pause = left / (done / elapsed) / 2 if done > 0 else POLL * 5
        await anyio.sleep(min(max(pause, POLL), MAX_POLL))


@dataclass
class DrainRun:
    rate: float  # jobs/s, first job start to last ack
    seconds: float
    startup: float  # worker spawn to first job start


async def drain_once(system: System, jobs: int, opts: Options, workers: int = 1) -> DrainRun:
    await system.clear()
    await system.prefill(jobs, opts.batch)
    mark = scratch(f"{system.name}-{system.kind}.mark")
    env = worker_env({MARK_ENV: str(mark), **system.worker_env()})
    argv = system.worker_argv(sys.executable, burst=True)
    procs = [
        WorkerProcess(argv, env, f"{system.name}-{system.kind}-{i}.log") for i in range(workers)
    ]
    spawned = procs[0].started
    try:
        end = await _wait_drained(system, procs, jobs, opts.timeout)
    finally:
        for p in procs:
            p.stop()
    first = read_mark(mark)
    if first is None:
        raise RuntimeError(f"{system.name}: no job ran (no start mark)")
    left = await system.pending()
    if left:
        raise RuntimeError(f"{system.name}: {left} jobs left after the drain")
    return DrainRun(jobs / (end - first), end - first, first - spawned)


async def measure(system: System, opts: Options) -> list[Figure]:
    runs: list[DrainRun] = []
    for i in range(opts.repeat):
        progress(
            f"drain {system.name} on {system.kind}: run {i + 1}/{opts.repeat}, {opts.jobs} jobs"
        )
        run = await drain_once(system, opts.jobs, opts)
        progress(f"  {run.rate:,.0f} jobs/s ({run.seconds:.2f}s, start-up {run.startup:.2f}s)")
        runs.append(run)
    return [
        Figure(
            measurement="drain",
            broker=system.kind,
            system=system.name,
            version=system.version,
            unit="jobs/s",
            better="higher",
            jobs=opts.jobs,
            settings=f"1 process; {system.drain_settings or system.worker_settings}",
            runs=[r.rate for r in runs],
            extra={"startup_s": [round(r.startup, 3) for r in runs]},
        )
    ]
