"""The broker contract, and how a broker is found from its URL.

A broker stores and moves jobs; it decides nothing. The core (``taskkit.worker`` and
``taskkit.retry``) decides whether a failed job retries or dies and hands the broker a frozen
``Outcome``. Every write after a claim is fenced by the claim's lease token: a worker whose lease
ran out can neither complete, fail, extend nor release the job any more.

Time is passed in as ``now`` (seconds since the epoch, from the core's clock) so the contract
suite can run a fake clock. Only the blocking wait in ``reserve`` touches wall time.

Brokers are plug-ins: the URL scheme is looked up in the entry-point group ``taskkit.brokers``
(``sqlite = "brokers.sqlite:SqliteBroker"``), and the class is imported only when used.
"""

from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from importlib.metadata import entry_points
from types import TracebackType
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

from taskkit.errors import BrokerURLError
from taskkit.job import Alert, AlertEvent, Delivery, Job, JobInfo, JobState, Lease, QueueStats
from taskkit.outcome import Outcome

DEFAULT_BROKER_URL = "sqlite:///taskkit.db"
BROKER_URL_ENV = "TASKKIT_BROKER_URL"
ENTRY_POINT_GROUP = "taskkit.brokers"

# The built-in brokers, used when the package's entry points are not installed (a plain checkout).
_BUILTIN = {
    "memory": "brokers.memory:MemoryBroker",
    "sqlite": "brokers.sqlite:SqliteBroker",
    "redis": "brokers.redis:RedisBroker",
    "rediss": "brokers.redis:RedisBroker",
    "postgresql": "brokers.postgres:PostgresBroker",
    "postgres": "brokers.postgres:PostgresBroker",
}


class Broker(ABC):
    """Stores jobs and delivers them under leases. Implementations must make each method atomic
    as documented; they must never compare attempts with max_attempts or pick a retry time.

    A broker is an async context manager: ``async with broker: ...`` connects and closes.
    Driver errors must be translated: an unreachable server raises ``BrokerUnavailable``, with the
    URL redacted by ``redact_url``.
    """

    url: str

    def __init__(self, url: str) -> None:
        self.url = url

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Build a broker from its URL. The URL is handed over untouched."""
        return cls(url, **options)

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- lifecycle ---------------------------------------------------------------------------

    @abstractmethod
    async def connect(self) -> None:
        """Open connections and check the storage is usable. Raises BrokerUnavailable (server
        unreachable) or SchemaMissing (storage missing or old: the message names the fix)."""

    @abstractmethod
    async def close(self) -> None:
        """Release connections. Safe to call twice."""

    # -- producing ---------------------------------------------------------------------------

    @abstractmethod
    async def enqueue(self, jobs: Sequence[Job], now: float) -> list[str]:
        """Store ``jobs`` in one atomic step; each is ready at ``job.run_at`` (or ``now``).

        A job whose ``dedupe_key`` is held by a pending or running job is not stored: the id of
        the job that holds the key is returned in its place. A job whose id the broker already
        holds is not stored again (enqueue is idempotent by id). Returns one id per input job,
        in order. An empty sequence is a no-op returning ``[]``. Queue names are validated.
        """

    @abstractmethod
    async def enqueue_raw(self, queue: str, payload: bytes | str, now: float) -> str:
        """Store a payload exactly as a foreign producer would (redis-cli LPUSH, a SQL INSERT):
        unvalidated, ready now, on ``queue``. Returns the id the broker gave it. A payload that
        does not decode is delivered all the same, so the core can dead-letter it with a reason.
        """

    # -- consuming ---------------------------------------------------------------------------

    @abstractmethod
    async def reserve(
        self,
        queues: Sequence[str],
        limit: int,
        lease_for: float,
        wait: float,
        now: float,
    ) -> list[Delivery]:
        """Claim up to ``limit`` due jobs from ``queues`` (skipping paused queues), highest
        priority first, then earliest run time; queues earlier in ``queues`` are preferred.

        Atomically per job: state running, attempts + 1, a fresh lease token, lease until
        ``now + lease_for``. Never hands one job to two callers. When nothing is due, waits up to
        ``wait`` wall-clock seconds for a job (taking the time as ``now`` plus the wall time spent
        waiting), then returns ``[]``.
        """

    @abstractmethod
    async def extend(self, leases: Sequence[Lease], lease_for: float, now: float) -> list[Lease]:
        """Heartbeat: push each lease's expiry to ``now + lease_for``. Returns the leases that
        were lost (their token no longer owns a running job); those jobs must not be touched."""

    @abstractmethod
    async def settle(self, items: Sequence[tuple[Lease, Outcome]], now: float) -> list[bool]:
        """Apply the core's decisions, one per lease, each only if its token still owns the job:

        - ``Complete``: the job is done; its dedupe key is freed; ``result`` is kept until
          ``keep_until`` when given, otherwise nothing of the job need remain.
        - ``Retry``: back to pending, runnable at ``run_at``, ``last_error`` recorded; with
          ``charge_attempt=False`` the claim's attempt is given back (attempts - 1).
        - ``DeadLetter``: state dead with ``error``; the dedupe key is freed; and, in the same
          atomic step, an alert is recorded as by ``record_alert`` with key
          ``dead_alert_key(queue, task)``, kind ``"dead"``, the job's id and ``error`` as detail.

        Returns, per item, True when applied and False when the lease was lost (refused).
        """

    @abstractmethod
    async def release(self, leases: Sequence[Lease], now: float) -> None:
        """Hand unfinished jobs back on shutdown: pending, runnable now, attempt given back.
        Leases that were already lost are ignored."""

    @abstractmethod
    async def reclaim_expired(
        self, queues: Sequence[str], lease_for: float, limit: int, now: float
    ) -> list[Delivery]:
        """Take over up to ``limit`` running jobs in ``queues`` whose lease ended before ``now``,
        whoever held them: each gets a fresh token (the old one is fenced off) and a lease until
        ``now + lease_for``. Attempts are NOT charged again: the lost run was charged when it was
        claimed. The caller settles each one (retry or dead letter). Safe to call from every
        worker at once: a job is taken over by one caller only."""

    # -- admin -------------------------------------------------------------------------------

    @abstractmethod
    async def get_job(self, job_id: str, now: float) -> JobInfo | None:
        """The job's state and fields, or None when the broker keeps nothing of it."""

    @abstractmethod
    async def stats(self, now: float) -> dict[str, QueueStats]:
        """Counts per queue: ready (due pending), scheduled (pending, due later), running, dead;
        whether the queue is paused; and ``oldest_ready_at``, when its longest-waiting ready job
        became due (its run_at). Queues with no jobs may be left out unless paused."""

    @abstractmethod
    async def list_dead(self, queue: str | None, limit: int) -> list[JobInfo]:
        """Dead jobs, newest first, optionally of one queue."""

    @abstractmethod
    async def requeue_dead(
        self, ids: Sequence[str] | None, queue: str | None, now: float
    ) -> list[str]:
        """Move dead jobs back to pending, runnable now, attempts reset to 0. ``ids`` selects
        jobs (ids that are not dead are skipped); ``ids=None`` means every dead job, of ``queue``
        when given. Returns the ids requeued."""

    @abstractmethod
    async def purge_dead(self, ids: Sequence[str] | None, queue: str | None) -> int:
        """Delete dead jobs (selected as in ``requeue_dead``). Returns how many were deleted."""

    @abstractmethod
    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume a queue. A paused queue accepts jobs but ``reserve`` skips it."""

    @abstractmethod
    async def cancel(self, job_id: str, keep_until: float, now: float) -> JobState | None:
        """Cancel a pending or scheduled job: state cancelled, readable by ``get_job`` until
        ``keep_until``, its dedupe key freed, never delivered again. A running job is not
        interrupted. Returns the job's state after the call: CANCELLED when it is cancelled
        (now or before), the unchanged RUNNING, DONE or DEAD otherwise, None for an unknown id."""

    @abstractmethod
    async def set_progress(self, lease: Lease, progress: str, now: float) -> bool:
        """Store ``progress`` (JSON text) on a running job, only while ``lease`` owns it.
        Every claim clears the progress, so each attempt starts afresh. Returns False, writing
        nothing, when the lease was lost."""

    # -- the alert outbox --------------------------------------------------------------------
    # One row per alert key. Recording merges into the key's row, so a flood of dead jobs of one
    # task is one pending alert with a count; delivery is at-least-once under a claim lease.

    @abstractmethod
    async def record_alert(self, event: AlertEvent, now: float) -> None:
        """Merge ``event`` into the row of ``event.key``, atomically:

        - no row: create it with count 1, first_at = last_at = next_at = now, attempts 0;
        - a row with count 0 (delivered): count 1, first_at = last_at = now, and next_at =
          max(next_at, now), so an alert delivered within its quiet window waits for its end;
        - a row with count > 0 (pending): count + 1, last_at = now, next_at unchanged.

        In every case queue, task, job_id and detail become the event's (detail cut to
        ``ALERT_DETAIL_LIMIT`` characters)."""

    @abstractmethod
    async def claim_alerts(self, limit: int, lease_for: float, now: float) -> list[Alert]:
        """Hand out up to ``limit`` pending alerts (count > 0) whose next_at <= now, earliest
        next_at first: each gets a fresh token and next_at = now + lease_for, so no other caller
        gets it until that lease runs out. Returns them with the count as claimed."""

    @abstractmethod
    async def finish_alert(
        self, alert: Alert, sent: bool, next_at: float, error: str | None, now: float
    ) -> bool:
        """Record one delivery attempt of a claimed ``alert``, only while its token still holds
        the row (else return False and write nothing). The token is cleared and next_at set.

        - ``sent``: count - alert.count (events recorded during delivery stay pending),
          attempts 0, last_error None, sent_at now.
        - not sent: attempts + 1, last_error ``error``.
        """

    @abstractmethod
    async def list_alerts(self, pending_only: bool, limit: int) -> list[Alert]:
        """Alert rows, oldest first_at first: only pending ones (count > 0) when asked."""

    # -- flow control shared by every worker --------------------------------------------------

    @abstractmethod
    async def acquire_rate(self, key: str, interval: float, now: float) -> float:
        """A rate limit of one grant per ``interval`` seconds per ``key``, for every caller:
        when ``now`` is at or after the key's next free time, record a grant (the next free time
        becomes ``now + interval``) and return 0.0; otherwise record nothing and return the
        seconds until the next free time."""

    @abstractmethod
    async def acquire_slot(self, key: str, holder: str, limit: int, ttl: float, now: float) -> bool:
        """A concurrency limit of ``limit`` holders per ``key``, for every caller, atomically:
        drop the key's holders whose expiry is before ``now``; if ``holder`` already holds a
        slot, or fewer than ``limit`` do, hold one until ``now + ttl`` and return True;
        otherwise return False. A holder that dies without releasing frees its slot at expiry."""

    @abstractmethod
    async def extend_slots(self, slots: Sequence[tuple[str, str]], ttl: float, now: float) -> None:
        """Heartbeat: push the expiry of each held ``(key, holder)`` to ``now + ttl``. Slots no
        longer held are not taken again."""

    @abstractmethod
    async def release_slots(self, slots: Sequence[tuple[str, str]]) -> None:
        """Give back each ``(key, holder)`` slot; ones not held are ignored."""

    async def wait_for_change(self, job_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a sign that ``job_id`` may have changed state.
        The default just sleeps; brokers with notifications can return sooner."""
        import anyio

        await anyio.sleep(timeout)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``; safe for logs, errors and reprs."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        port = f":{parts.port}" if parts.port else ""
        user = parts.username or ""
        netloc = f"{user}:***@{host}{port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    except ValueError:
        # Unparseable: keep only the scheme so nothing secret can leak.
        scheme = url.split(":", 1)[0] if ":" in url else ""
        return f"{scheme}://***" if scheme else "***"


def resolve_broker_url(explicit: str | None = None) -> str:
    """``--broker`` beats ``TASKKIT_BROKER_URL``, which beats ``sqlite:///taskkit.db``."""
    return explicit or os.environ.get(BROKER_URL_ENV) or DEFAULT_BROKER_URL


def known_schemes() -> list[str]:
    """Every URL scheme a broker is installed for."""
    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def broker_class(scheme: str) -> type[Broker]:
    """Import the broker class registered for ``scheme``."""
    target: str | None = None
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=scheme):
        target = ep.value
        break
    target = target or _BUILTIN.get(scheme)
    if target is None:
        raise BrokerURLError(
            f"no broker for scheme {scheme!r}; known schemes: {', '.join(known_schemes())}"
        )
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = {
            "redis": "redis",
            "rediss": "redis",
            "postgresql": "postgres",
            "postgres": "postgres",
        }
        hint = (
            f" (install it with: pip install 'taskkit[{extra[scheme]}]')" if scheme in extra else ""
        )
        raise BrokerURLError(f"the {scheme!r} broker cannot be imported: {exc}{hint}") from None
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Broker)):
        raise BrokerURLError(f"{target} registered for {scheme!r} is not a Broker subclass")
    return cls


def broker_from_url(url: str | None = None, **options: Any) -> Broker:
    """Build the broker a URL names (after ``resolve_broker_url``). Not yet connected."""
    url = resolve_broker_url(url)
    try:
        scheme = urlsplit(url).scheme
    except ValueError as exc:
        raise BrokerURLError(f"cannot parse broker URL {redact_url(url)}: {exc}") from None
    if not scheme:
        raise BrokerURLError(
            f"broker URL {redact_url(url)!r} has no scheme; expected one of: "
            f"{', '.join(known_schemes())} (for example sqlite:///taskkit.db)"
        )
    return broker_class(scheme).from_url(url, **options)
