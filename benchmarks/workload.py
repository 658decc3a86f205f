"""The worker side of every measurement: the no-op task's two bits of bookkeeping, shared by
taskkit and every peer so that all of them do exactly the same work per job.

- ``mark_started()``: the first job run in a process writes the wall time to the file named by
  ``TASKKIT_BENCH_MARK`` (created exclusively: with several processes or threads the first one
  wins). A drain is timed from there, so interpreter start-up and imports, which differ a lot
  between frameworks (Celery's take a second), are not counted as draining. After the first call
  it costs one global lookup.
- ``record_latency(enqueued)``: appends "enqueued started" to the file named by
  ``TASKKIT_BENCH_LATENCY``, one ``os.write`` on an O_APPEND descriptor (atomic for short lines,
  so threads and processes can share it). A file and not the broker: no extra round trip.

It imports nothing but the standard library, so a peer's worker does not load taskkit.
"""

from __future__ import annotations

import os
import time

MARK_ENV = "TASKKIT_BENCH_MARK"
LATENCY_ENV = "TASKKIT_BENCH_LATENCY"
# The broker URL a peer's worker module connects to (its CLI imports the module: no arguments).
URL_ENV = "TASKKIT_BENCH_URL"

_marked = False
_latency_fd: int | None = None


def mark_started() -> None:
    global _marked
    if _marked:
        return
    _marked = True
    path = os.environ.get(MARK_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return  # another process of the same run was first
    try:
        os.write(fd, repr(time.time()).encode())
    finally:
        os.close(fd)


def record_latency(enqueued: float) -> None:
    started = time.time()  # first: nothing below is part of the latency
    global _latency_fd
    if _latency_fd is None:
        path = os.environ.get(LATENCY_ENV)
        if not path:
            return
        _latency_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(_latency_fd, f"{enqueued!r} {started!r}\n".encode())
