"""Chaos run: worker processes drain jobs while a driver SIGKILLs them; nothing may be lost.

    python -m benchmarks.chaos --broker URL --jobs N --workers W --kills K

W `taskkit worker` processes drain N jobs of a task that records every execution in a ledger
file the broker knows nothing of; a middleware records every completion the broker accepted
(a worker killed right after the broker committed a completion may miss that line, so whether a
job completed is read from the broker at the end: the task keeps its result).
Every ``--interval`` seconds the driver kills a random worker with SIGKILL and starts a
replacement, K times in all. At the end it prints: jobs enqueued, completed, lost (never
completed), completed twice, executed more than once, dead. It passes (exit 0) when lost = 0
and completed twice = 0. Running a job more than once is allowed: delivery is at-least-once.

``--restart-server CMD`` runs a shell command once, halfway through the kills (a test passes
one that restarts the broker's server).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from taskkit import App, Job
from taskkit.broker import broker_from_url, redact_url

TASK = "chaos.record"


@dataclass
class Report:
    enqueued: int
    completed: int
    lost: int
    completed_twice: int
    executed_more_than_once: int
    dead: int
    seconds: float
    runs_before_restart: int | None = None  # executions recorded when the server restarted

    @property
    def passed(self) -> bool:
        return self.lost == 0 and self.completed_twice == 0

    def table(self) -> str:
        rows = [
            ("jobs enqueued", self.enqueued),
            ("completed", self.completed),
            ("lost (never completed)", self.lost),
            ("completed twice", self.completed_twice),
            ("executed more than once", self.executed_more_than_once),
            ("dead", self.dead),
        ]
        lines = [f"{name:<26}{value:>10}" for name, value in rows]
        lines.append(f"{'seconds':<26}{self.seconds:>10.1f}")
        if self.runs_before_restart is not None:
            lines.append(f"{'ran before the restart':<26}{self.runs_before_restart:>10}")
        lines.append("PASS" if self.passed else "FAIL")
        return "\n".join(lines)


def _start_worker(
    url: str, ledger: Path, lease: float, concurrency: int, n: int, job_seconds: float | None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CHAOS_LEDGER": str(ledger), "TASKKIT_LOG_LEVEL": "WARNING"}
    if job_seconds is not None:
        env["CHAOS_JOB_SECONDS"] = str(job_seconds)
    log = open(ledger.with_name(f"worker-{n}.log"), "wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "taskkit.cli",
            "worker",
            "benchmarks.chaos_tasks:router",
            "--broker",
            url,
            "--lease",
            str(lease),
            "--concurrency",
            str(concurrency),
            "--worker-id",
            f"chaos-{n}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _read_ledger(ledger: Path) -> tuple[Counter[str], Counter[str]]:
    runs: Counter[str] = Counter()
    acks: Counter[str] = Counter()
    for line in ledger.read_text().splitlines():
        kind, _, job = line.partition(" ")
        (runs if kind == "run" else acks)[job] += 1
    return runs, acks


async def _enqueue(url: str, jobs: int) -> list[str]:
    async with App(None, url) as app:
        ids: list[str] = []
        for start in range(0, jobs, 1000):
            batch = [
                Job(task=TASK, args=[i], max_attempts=25)
                for i in range(start, min(jobs, start + 1000))
            ]
            ids += [h.id for h in await app.enqueue_jobs(batch)]
        return ids


async def _unfinished(url: str) -> int:
    async with broker_from_url(url) as broker:
        stats = await broker.stats(time.time())
        return sum(s.ready + s.scheduled + s.running for s in stats.values())


async def _final_states(url: str, ids: list[str]) -> Counter[str]:
    """Per job id: "done", "dead", or what else the broker says (or "missing")."""
    states: Counter[str] = Counter()
    async with broker_from_url(url) as broker:
        now = time.time()
        for job_id in ids:
            info = await broker.get_job(job_id, now)
            states["missing" if info is None else info.state.value] += 1
    return states


def run(
    url: str,
    jobs: int,
    workers: int,
    kills: int,
    *,
    interval: float = 2.0,
    lease: float = 2.0,
    concurrency: int = 10,
    timeout: float = 600.0,
    restart_server: Callable[[], None] | None = None,
    workdir: Path | None = None,
    job_seconds: float | None = None,
) -> Report:
    """Run the chaos scenario and return its figures. ``restart_server`` is called once,
    halfway through the kills."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="taskkit-chaos-"))
    ledger = workdir / "ledger.txt"
    ledger.touch()
    started = time.monotonic()
    ids = anyio.run(_enqueue, url, jobs)
    procs = [_start_worker(url, ledger, lease, concurrency, n, job_seconds) for n in range(workers)]
    spawned = workers
    runs_before_restart: int | None = None
    rng = random.Random(1234)
    try:
        for k in range(kills):
            time.sleep(interval)
            victim = rng.randrange(len(procs))
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait()
            procs[victim] = _start_worker(url, ledger, lease, concurrency, spawned, job_seconds)
            spawned += 1
            if restart_server is not None and k == kills // 2:
                runs_before_restart = sum(_read_ledger(ledger)[0].values())
                restart_server()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and anyio.run(_unfinished, url):
            time.sleep(0.5)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    runs, acks = _read_ledger(ledger)
    states = anyio.run(_final_states, url, ids)
    return Report(
        enqueued=len(ids),
        completed=states["done"],
        lost=len(ids) - states["done"] - states["dead"],
        completed_twice=sum(1 for i in ids if acks[i] > 1),
        executed_more_than_once=sum(1 for i in ids if runs[i] > 1),
        dead=states["dead"],
        seconds=time.monotonic() - started,
        runs_before_restart=runs_before_restart,
    )


def _shell(command: str) -> Callable[[], None]:
    def restart() -> None:
        subprocess.run(command, shell=True, check=True, timeout=120)

    return restart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--lease", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--restart-server", metavar="CMD")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(
        f"chaos on {redact_url(args.broker)}: {args.jobs} jobs, {args.workers} workers, "
        f"{args.kills} kills",
        file=sys.stderr,
    )
    report = run(
        args.broker,
        args.jobs,
        args.workers,
        args.kills,
        interval=args.interval,
        lease=args.lease,
        concurrency=args.concurrency,
        timeout=args.timeout,
        restart_server=_shell(args.restart_server) if args.restart_server else None,
    )
    print(json.dumps(report.__dict__) if args.json else report.table())
    raise SystemExit(0 if report.passed else 1)


if __name__ == "__main__":
    main()
