"""Rate and concurrency limits that hold across every worker of a broker.

A task declares them (``@task(rate_limit="60/m", concurrency=2)``) and a router can cap a whole
queue (``router.limit_queue("video", concurrency=2)``). The broker keeps the shared state
(``acquire_rate`` and the ``*_slot(s)`` methods); this module decides, for a claimed job, whether
it may run now. A job over a limit is snoozed, never failed: it goes back to the queue without
using an attempt and comes back later (seed 003: an upstream answering 429 must not kill jobs).

Concurrency slots are held under the job's id with the job's lease time and renewed by the
worker's heartbeat, so the slot of a worker that dies comes back when its lease would have.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from taskkit.errors import ConfigurationError

_PERIODS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d*\.?\d*)\s*([smhd])\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` runs per ``period`` seconds, evenly spaced: one per ``interval``.

    Even spacing (no burst) is what an upstream that answers 429 wants, and it guarantees that no
    window of ``period`` seconds holds more than ``count`` runs.
    """

    count: int
    period: float
    text: str

    @property
    def interval(self) -> float:
        return self.period / self.count

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"60/m"``, ``"10/s"``, ``"1000/h"``, ``"5/d"``, or with a multiple: ``"3/10s"``."""
        match = _RATE_RE.match(text)
        if match is None or int(match[1]) < 1 or (match[2] and float(match[2]) <= 0):
            raise ConfigurationError(
                f"rate_limit {text!r} is not COUNT/PERIOD; write for example '60/m', '10/s', "
                "'1000/h' or '3/10s' (COUNT at least 1; PERIOD in s, m, h or d)"
            )
        multiple = float(match[2]) if match[2] else 1.0
        return cls(int(match[1]), multiple * _PERIODS[match[3]], text.strip())


def rate_key(task: str) -> str:
    return f"rate:task:{task}"


def task_slot_key(task: str) -> str:
    return f"task:{task}"


def queue_slot_key(queue: str) -> str:
    return f"queue:{queue}"


class Parked:
    """How many jobs of each limit this worker has snoozed and not yet seen again.

    A snoozed job is spread over a wait that grows with that number, so a backlog of N jobs over
    a limit comes back about once per free slot instead of all at the same instant (a thundering
    herd of claims that are refused again).
    """

    def __init__(self) -> None:
        self._until: dict[str, list[float]] = {}

    def waiting(self, key: str, now: float) -> int:
        times = [t for t in self._until.get(key, ()) if t > now]
        if times:
            self._until[key] = times
        else:
            self._until.pop(key, None)
        return len(times)

    def snooze_for(self, key: str, base: float, step: float, now: float) -> float:
        """Seconds to snooze one more job: ``base``, one ``step`` per job already parked (its
        place in line), and a random part of a step so workers' lines interleave."""
        ahead = self.waiting(key, now)
        if ahead == 0 or base < step / 2:
            # Next in line and just early (clocks and polling jitter): keep its place.
            delay = base + random.uniform(0.0, step / 10)
        else:
            delay = base + step * ahead + random.uniform(0.0, step)
        self._until.setdefault(key, []).append(now + delay)
        return delay
