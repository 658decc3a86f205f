"""Memory (taskkit only): one worker's resident memory (RSS) when idle after start-up, after
draining ``--jobs`` no-op jobs, and its peak (VmHWM), from /proc.

The worker starts on an empty queue and runs one warm-up job (imports done, connections open):
that is "before". Then the jobs are enqueued in batches while it runs; once the queue is empty,
"after". A worker that holds on to something per job shows it as after - before.
"""

from __future__ import annotations

import sys

from benchmarks.common import (
    Figure,
    Options,
    WorkerProcess,
    progress,
    read_mark,
    rss_bytes,
    scratch,
    wait_for,
    worker_env,
)
from benchmarks.system import System
from benchmarks.workload import MARK_ENV

MIB = 1024 * 1024


async def memory_once(system: System, opts: Options) -> tuple[float, float, float]:
    await system.clear()
    mark = scratch(f"{system.name}-{system.kind}-mem.mark")
    env = worker_env({MARK_ENV: str(mark), **system.worker_env()})
    worker = WorkerProcess(
        system.worker_argv(sys.executable), env, f"{system.name}-{system.kind}-mem.log"
    )
    try:
        await system.enqueue_one()

        async def idle() -> bool:
            return read_mark(mark) is not None and await system.pending() == 0

        await wait_for(idle, timeout=opts.timeout, interval=0.05, workers=[worker], what="warm-up")
        before, _ = rss_bytes(worker.pid)
        await system.prefill(opts.jobs, opts.batch)

        async def drained() -> bool:
            return await system.pending() == 0

        await wait_for(drained, timeout=opts.timeout, interval=0.1, workers=[worker], what="drain")
        after, peak = rss_bytes(worker.pid)
    finally:
        worker.stop()
    return before / MIB, after / MIB, peak / MIB


async def measure(system: System, opts: Options) -> list[Figure]:
    runs: list[tuple[float, float, float]] = []
    for i in range(opts.repeat):
        progress(f"memory {system.name} on {system.kind}: run {i + 1}/{opts.repeat}")
        runs.append(await memory_once(system, opts))
        progress("  before {:.1f} MiB, after {:.1f} MiB, peak {:.1f} MiB".format(*runs[-1]))
    await system.clear()
    names = ("memory before", "memory after", "memory peak")
    return [
        Figure(
            measurement=name,
            broker=system.kind,
            system=system.name,
            version=system.version,
            unit="MiB",
            better="lower",
            jobs=0 if k == 0 else opts.jobs,
            settings=f"1 process; {system.worker_settings}",
            runs=[r[k] for r in runs],
        )
        for k, name in enumerate(names)
    ]
