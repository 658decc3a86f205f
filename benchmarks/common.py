"""What every measurement shares: the run options, one figure (median and spread of K runs),
progress lines, worker subprocesses and the marker files a worker writes its timestamps to."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
# Scratch files (markers, latency logs, worker logs, the default SQLite database): gitignored.
CACHE = ROOT / ".bench-cache"
# This run's own folder: two runs at once (two pytest sessions in one tree) never share a marker.
RUN_DIR = CACHE / f"run-{os.getpid()}"


@dataclass
class Options:
    """The command line, as every measurement sees it."""

    brokers: list[str]
    jobs: int
    single_jobs: int
    repeat: int
    peers: list[str]
    concurrency: int
    batch: int
    latency_jobs: int
    latency_rate: float
    big: int
    workers: list[int]
    redis_db_base: int
    timeout: float


@dataclass
class Figure:
    """One measured figure: the median of ``runs`` and, for the table, its spread.

    ``settings`` says how the system was set up for it (printed next to the figure)."""

    measurement: str
    broker: str
    system: str
    version: str
    unit: str
    better: str  # "higher" or "lower": which way the ratio to the best peer reads
    jobs: int
    settings: str
    runs: list[float]
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(median=self.median, min=min(self.runs), max=max(self.runs))
        return out


@dataclass
class Skipped:
    system: str
    broker: str
    measurement: str
    reason: str


def progress(message: str) -> None:
    """A progress line on stderr: stdout stays clean for ``--json``."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def scratch(name: str) -> Path:
    """A fresh path under the cache directory (any old file of that name removed)."""
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    path = RUN_DIR / name
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return path


def read_mark(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return float(text) if text else None


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def worker_env(extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of a worker subprocess: this one, the repo on the path (the workers import
    ``benchmarks.*`` modules), no buffering, and the bench variables."""
    env = dict(os.environ)
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in path:
        path.append(str(ROOT))
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class WorkerProcess:
    """A worker subprocess; its output goes to a log file (shown if it fails)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_name: str) -> None:
        self.argv = list(argv)
        self.log_path = scratch(log_name)
        self._log = self.log_path.open("wb")
        self.started = time.time()
        # Own session: stopping it also stops the children a peer's supervisor forks.
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def exited(self) -> int | None:
        return self.proc.poll()

    def tail(self, lines: int = 20) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to the worker's process group, SIGKILL after ``grace`` seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.proc.wait()
        # Children a supervisor left behind (it died first) go too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self._log.close()

    def failure(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"{what}: worker {self.argv!r} exited with {self.proc.poll()}; its log:\n{self.tail()}"
        )


async def wait_for(
    check: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    interval: float,
    workers: Sequence[WorkerProcess] = (),
    what: str = "condition",
) -> float:
    """Poll ``check`` every ``interval`` seconds until true; the wall time it first was.

    Fails early when a worker that should still be running has exited with an error."""
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return time.time()
        for w in workers:
            code = w.exited()
            if code is not None and code != 0:
                raise w.failure(what)
        if time.monotonic() > deadline:
            logs = "\n".join(w.tail() for w in workers)
            raise TimeoutError(f"{what}: not reached within {timeout}s\n{logs}")
        await anyio.sleep(interval)


def rss_bytes(pid: int) -> tuple[int, int]:
    """(current RSS, peak RSS) of a process, from /proc (Linux)."""
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank: a value that was actually observed."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
