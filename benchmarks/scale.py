"""Scale (taskkit only): the drain with a backlog of 10k and of ``--big`` jobs, served by 1, 2
and 4 worker processes (``--workers``). Same timing as ``drain``: first job start to the exit of
the last ``--burst`` worker."""

from __future__ import annotations

from benchmarks.common import Figure, Options, progress
from benchmarks.drain import drain_once
from benchmarks.system import System

SMALL = 10_000


async def measure(system: System, opts: Options) -> list[Figure]:
    figures = []
    for size in sorted({SMALL, opts.big}):
        for workers in opts.workers:
            runs = []
            for i in range(opts.repeat):
                progress(
                    f"scale {system.name} on {system.kind}: {size} jobs, {workers} worker(s), "
                    f"run {i + 1}/{opts.repeat}"
                )
                run = await drain_once(system, size, opts, workers)
                progress(f"  {run.rate:,.0f} jobs/s ({run.seconds:.2f}s)")
                runs.append(run.rate)
            figures.append(
                Figure(
                    measurement=f"scale {_size(size)} x{workers}w",
                    broker=system.kind,
                    system=system.name,
                    version=system.version,
                    unit="jobs/s",
                    better="higher",
                    jobs=size,
                    settings=f"{workers} process(es); {system.drain_settings}",
                    runs=runs,
                    extra={"workers": workers},
                )
            )
    await system.clear()
    return figures


def _size(n: int) -> str:
    return (
        f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)
    )
