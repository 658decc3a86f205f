"""Periodic tasks: when they are due, and how many workers enqueue each tick exactly once.

A periodic task is declared on the router (``@router.task(cron="*/5 * * * *")`` or
``every=30``) and run by the workers themselves; there is no beat process. Every worker that
serves the task's queue computes the latest tick at or before its clock and enqueues a job whose
id is derived from (task, tick). Enqueue is idempotent by id on every broker while the broker
keeps the job, and a periodic job is kept (``keep_result``) for two periods plus ten minutes. So:

- many workers enqueue the same tick: one job;
- a worker that restarts enqueues the latest tick again: still one job, and none skipped;
- a worker whose clock runs ahead enqueues the tick early, but as a job scheduled at the tick.

After an outage longer than a period only the latest missed tick runs, not every missed one.
Cron expressions are evaluated by cronsim (DST-correct), in the task's ``timezone`` (UTC by
default); ``every`` ticks fall on multiples of the interval since the epoch.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from taskkit.errors import ConfigurationError

_SAFETY = 600.0  # seconds of clock skew between workers that a tick's record outlives


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a periodic task is due: a cron expression or a fixed interval in seconds."""

    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError("a periodic task takes cron=... or every=..., not both")
        if self.every is not None and self.every <= 0:
            raise ConfigurationError(f"every must be a positive number of seconds: {self.every}")
        try:
            zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(f"unknown time zone {self.timezone!r}") from None
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(zone))
            except CronSimError as exc:
                raise ConfigurationError(f"bad cron expression {self.cron!r}: {exc}") from None

    def __str__(self) -> str:
        return f"cron {self.cron} ({self.timezone})" if self.cron else f"every {self.every:g}s"

    @property
    def period(self) -> float:
        """The longest gap between ticks (for cron: measured over the next few ticks)."""
        if self.every is not None:
            return self.every
        it = CronSim(self.cron or "", datetime.now(ZoneInfo(self.timezone)))
        ticks = [next(it).timestamp() for _ in range(8)]
        return max(b - a for a, b in itertools.pairwise(ticks))

    def latest_at_or_before(self, when: float) -> float:
        """The most recent tick at or before ``when`` (seconds since the epoch)."""
        if self.every is not None:
            return math.floor(when / self.every) * self.every
        zone = ZoneInfo(self.timezone)
        # cronsim's reverse iteration excludes its start: start a minute late, skip what is ahead.
        start = datetime.fromtimestamp(when, zone) + timedelta(minutes=1)
        for tick in CronSim(self.cron or "", start, reverse=True):
            if tick.timestamp() <= when:
                return tick.timestamp()
        raise ConfigurationError(f"cron {self.cron!r} never fires")  # pragma: no cover

    def next_after(self, when: float) -> float:
        """The first tick strictly after ``when``."""
        if self.every is not None:
            return (math.floor(when / self.every) + 1) * self.every
        zone = ZoneInfo(self.timezone)
        for tick in CronSim(self.cron or "", datetime.fromtimestamp(when, zone)):
            if tick.timestamp() > when:
                return tick.timestamp()
        raise ConfigurationError(f"cron {self.cron!r} never fires")  # pragma: no cover

    def retention(self) -> float:
        """How long a tick's job is kept, so no worker can enqueue that tick again."""
        return 2 * self.period + _SAFETY


def tick_job_id(task_name: str, tick: float) -> str:
    """The id of the job for ``task_name``'s tick at ``tick``: the same on every worker."""
    return hashlib.sha256(f"{task_name}@{tick:.3f}".encode()).hexdigest()[:32]
