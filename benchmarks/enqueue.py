"""Enqueue: jobs/s of one producer, one job per call (sequential awaits) and in batches.

Single: ``--single-jobs`` calls of the system's ordinary enqueue, one after the other, each
awaited before the next (what a web request handler does). Batch: ``--jobs`` jobs through the
system's bulk API, ``--batch`` per call; systems without one are reported as skipped.
"""

from __future__ import annotations

import time

from benchmarks.common import Figure, Options, Skipped, progress
from benchmarks.system import System


async def single_once(system: System, n: int) -> float:
    await system.clear()
    t0 = time.perf_counter()
    for _ in range(n):
        await system.enqueue_one()
    return n / (time.perf_counter() - t0)


async def batch_once(system: System, n: int, batch: int) -> float:
    await system.clear()
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        await system.enqueue_batch(min(batch, n - start))
    return n / (time.perf_counter() - t0)


async def measure(system: System, opts: Options) -> tuple[list[Figure], list[Skipped]]:
    single = min(opts.single_jobs, opts.jobs)
    figures: list[Figure] = []
    skipped: list[Skipped] = []
    runs = []
    for i in range(opts.repeat):
        progress(f"enqueue {system.name} on {system.kind}: single, run {i + 1}, {single} jobs")
        runs.append(await single_once(system, single))
        progress(f"  {runs[-1]:,.0f} jobs/s")
    figures.append(_figure("enqueue single", system, single, system.enqueue_settings, runs))
    if not system.has_batch_enqueue:
        reason = f"{system.name} has no bulk enqueue API"
        skipped.append(Skipped(system.name, system.kind, "enqueue batch", reason))
        await system.clear()
        return figures, skipped
    runs = []
    for i in range(opts.repeat):
        progress(f"enqueue {system.name} on {system.kind}: batch, run {i + 1}, {opts.jobs} jobs")
        runs.append(await batch_once(system, opts.jobs, opts.batch))
        progress(f"  {runs[-1]:,.0f} jobs/s")
    settings = f"{system.batch_settings}, batch={opts.batch}"
    figures.append(_figure("enqueue batch", system, opts.jobs, settings, runs))
    await system.clear()
    return figures, skipped


def _figure(what: str, system: System, jobs: int, settings: str, runs: list[float]) -> Figure:
    return Figure(
        measurement=what,
        broker=system.kind,
        system=system.name,
        version=system.version,
        unit="jobs/s",
        better="higher",
        jobs=jobs,
        settings=settings,
        runs=runs,
    )
