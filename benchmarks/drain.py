"""Drain: N no-op jobs already queued, worker processes started, time to the last ack.

Timed from the first job's start (the task writes it to a marker file, once) to the first poll,
every 20 ms, of the system's own count of unacknowledged jobs that finds none (taskkit:
``broker.stats``; a peer: the length of its queue and of its in-flight set), or the exit of
every worker in burst mode, whichever comes first. No round trip per job is added. The same
method for every system: taskkit's burst exit alone would add its final 0.2 s claim wait and
its shutdown to its time. Worker start-up (interpreter, imports,
connecting) is reported apart, as ``startup_s``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from benchmarks.common import (
    Figure,
    Options,
    WorkerProcess,
    progress,
    read_mark,
    scratch,
    wait_for,
    worker_env,
)
from benchmarks.system import System
from benchmarks.workload import MARK_ENV

POLL = 0.02  # seconds between a peer's queue-length polls: the resolution of its end time


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

        async def drained() -> bool:
            codes = [p.exited() for p in procs]
            failed = next((p for p, c in zip(procs, codes, strict=True) if c), None)
            if failed is not None:
                raise failed.failure(f"{system.name} drain")
            # A burst worker that exited 0 found the queue empty itself; otherwise ask.
            return all(c == 0 for c in codes) or await system.pending() == 0

        end = await wait_for(drained, timeout=opts.timeout, interval=POLL, what="drain")
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
