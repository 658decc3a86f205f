"""Latency: an idle worker, jobs enqueued one at a time at a paced rate, enqueue -> start.

Each job carries ``time.time()`` taken just before its enqueue call; the task takes
``time.time()`` first thing and appends both to a file (no broker round trip). One warm-up job
runs first (connections open, code paths warm) and is not counted. Reported: the median (p50)
and the 99th percentile (p99) over ``--latency-jobs`` jobs at ``--latency-rate`` jobs/s.
"""

from __future__ import annotations

import sys
import time

import anyio

from benchmarks.common import (
    Figure,
    Options,
    WorkerProcess,
    count_lines,
    percentile,
    progress,
    scratch,
    wait_for,
    worker_env,
)
from benchmarks.system import System
from benchmarks.workload import LATENCY_ENV

WARM_UP = 0.0  # the enqueue time the warm-up job carries: recognised and dropped


async def latency_once(system: System, opts: Options) -> list[float]:
    """Latencies in milliseconds of one run."""
    await system.clear()
    log = scratch(f"{system.name}-{system.kind}.latency")
    env = worker_env({LATENCY_ENV: str(log), **system.worker_env()})
    worker = WorkerProcess(
        system.worker_argv(sys.executable), env, f"{system.name}-{system.kind}-lat.log"
    )
    n = opts.latency_jobs
    try:
        await system.enqueue_stamped(WARM_UP)

        async def lines(k: int) -> bool:
            return count_lines(log) >= k

        await wait_for(
            lambda: lines(1), timeout=opts.timeout, interval=0.05, workers=[worker], what="warm-up"
        )
        interval = 1.0 / opts.latency_rate
        t0 = time.monotonic()
        for i in range(n):
            # Paced on a fixed grid, not sleep-after-send: a slow enqueue does not slow the rate.
            delay = t0 + i * interval - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            await system.enqueue_stamped(time.time())
        await wait_for(
            lambda: lines(n + 1), timeout=opts.timeout, interval=0.05, workers=[worker], what="all"
        )
    finally:
        worker.stop()
    out = []
    for line in log.read_text().splitlines():
        enqueued, started = (float(x) for x in line.split())
        if enqueued != WARM_UP:
            out.append((started - enqueued) * 1000)
    return out


async def measure(system: System, opts: Options) -> list[Figure]:
    p50s, p99s = [], []
    for i in range(opts.repeat):
        progress(
            f"latency {system.name} on {system.kind}: run {i + 1}/{opts.repeat}, "
            f"{opts.latency_jobs} jobs at {opts.latency_rate:g}/s"
        )
        values = await latency_once(system, opts)
        p50s.append(percentile(values, 50))
        p99s.append(percentile(values, 99))
        progress(f"  p50 {p50s[-1]:.2f} ms, p99 {p99s[-1]:.2f} ms")
    await system.clear()
    settings = f"1 process; {system.worker_settings}; paced {opts.latency_rate:g} jobs/s"
    return [
        Figure(
            measurement=f"latency {which}",
            broker=system.kind,
            system=system.name,
            version=system.version,
            unit="ms",
            better="lower",
            jobs=opts.latency_jobs,
            settings=settings,
            runs=runs,
        )
        for which, runs in (("p50", p50s), ("p99", p99s))
    ]
