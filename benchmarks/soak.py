"""Soak run: one worker process, a steady enqueue rate, minutes on end; watch memory and rate.

    python -m benchmarks.soak --broker URL --minutes 10 --rate 300

A `taskkit worker` process serves a no-op task while this process enqueues ``--rate`` jobs per
second in small batches. Every minute it prints the jobs enqueued and completed in that minute,
the backlog (ready + scheduled + running) and the worker's resident memory (RSS). A healthy run
keeps up with the rate, holds the backlog near zero, and its RSS stops growing after warm-up.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import anyio

from taskkit import App, Job
from taskkit.broker import redact_url

TASK = "soak.noop"


@dataclass
class Minute:
    minute: int
    enqueued: int
    completed: int
    backlog: int
    rss_mb: float


def rss_mb(pid: int) -> float:
    """Resident memory of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _backlog(app: App) -> int:
    stats = await app.broker.stats(app.clock.now())
    return sum(s.ready + s.scheduled + s.running for s in stats.values())


async def soak(url: str, minutes: float, rate: float, concurrency: int) -> list[Minute]:
    env = {**os.environ, "TASKKIT_LOG_LEVEL": "WARNING"}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskkit.cli",
            "worker",
            "benchmarks.soak_tasks:router",
            "--broker",
            url,
            "--concurrency",
            str(concurrency),
        ],
        env=env,
    )
    rows: list[Minute] = []
    try:
        async with App(None, url) as app:
            start = time.monotonic()
            enqueued = sent_this_minute = 0
            backlog_before = await _backlog(app)
            tick = 0.1
            while (elapsed := time.monotonic() - start) < minutes * 60:
                due = int(rate * (elapsed + tick)) - enqueued
                if due > 0:
                    await app.enqueue_jobs([Job(task=TASK) for _ in range(due)])
                    enqueued += due
                    sent_this_minute += due
                minute = int(elapsed // 60) + 1
                if minute > len(rows) + 1 or elapsed + tick >= minutes * 60:
                    backlog = await _backlog(app)
                    done = sent_this_minute - (backlog - backlog_before)
                    rows.append(
                        Minute(len(rows) + 1, sent_this_minute, done, backlog, rss_mb(worker.pid))
                    )
                    print(_row(rows[-1]), flush=True)
                    backlog_before, sent_this_minute = backlog, 0
                await anyio.sleep(max(0.0, start + elapsed + tick - time.monotonic()))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return rows


def _row(m: Minute) -> str:
    return f"{m.minute:>6} {m.enqueued:>10} {m.completed:>10} {m.backlog:>8} {m.rss_mb:>9.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=float, default=300, help="jobs enqueued per second")
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    print(f"soak on {redact_url(args.broker)}: {args.rate:g} jobs/s for {args.minutes:g} min")
    print(f"{'minute':>6} {'enqueued':>10} {'completed':>10} {'backlog':>8} {'RSS MB':>9}")
    rows = anyio.run(soak, args.broker, args.minutes, args.rate, args.concurrency)
    if rows:
        growth = rows[-1].rss_mb - rows[0].rss_mb
        print(
            f"RSS {rows[0].rss_mb:.1f} MB after minute 1, {rows[-1].rss_mb:.1f} MB at the end "
            f"({growth:+.1f} MB)"
        )


if __name__ == "__main__":
    main()
