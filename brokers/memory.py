"""MemoryBroker: jobs in a dict in this process (``memory://`` or ``memory://NAME``).

For tests and examples: nothing survives the process. Brokers built from the same URL in one
process share one store, so a producer and a worker in one program see the same jobs. It is also
the reference implementation of the contract: short, with no storage concerns in the way.
"""

from __future__ import annotations

import heapq
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import anyio

from taskkit.broker import Broker
from taskkit.errors import BrokerURLError
from taskkit.job import (
    ALERT_DETAIL_LIMIT,
    DEFAULT_QUEUE,
    Alert,
    AlertEvent,
    Delivery,
    Job,
    JobInfo,
    JobState,
    Lease,
    QueueStats,
    dead_alert_key,
    new_job_id,
    peek_task,
    validate_queue_name,
)
from taskkit.outcome import Complete, DeadLetter, Outcome, Retry


@dataclass(slots=True)
class _Record:
    id: str
    queue: str
    payload: str | bytes  # bytes only for a foreign payload that is not UTF-8
    run_at: float
    priority: int = 0
    state: JobState = JobState.PENDING
    attempts: int = 0
    max_attempts: int | None = None
    dedupe_key: str | None = None
    token: str | None = None
    lease_until: float = 0.0
    last_error: str | None = None
    result: str | None = None
    enqueued_at: float = 0.0
    finished_at: float | None = None
    expires_at: float | None = None
    started_at: float | None = None
    progress: str | None = None
    seq: int = 0


@dataclass
class _Store:
    jobs: dict[str, _Record] = field(default_factory=dict)
    dedupe: dict[str, str] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    pending: dict[str, list[tuple[int, float, int, str]]] = field(default_factory=dict)
    seq: int = 0
    changed: anyio.Event | None = None
    alerts: dict[str, Alert] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # key -> next free time
    slots: dict[str, dict[str, float]] = field(default_factory=dict)  # key -> holder -> expiry


_STORES: dict[str, _Store] = {}


def _as_text(payload: bytes | str) -> str | bytes:
    """Payloads are kept as text; bytes that are not UTF-8 stay bytes so the worker can say so."""
    if isinstance(payload, str):
        return payload
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload


class MemoryBroker(Broker):
    """An in-process broker. ``memory://NAME`` selects a store shared by name in this process."""

    def __init__(self, url: str = "memory://", **options: Any) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        if parts.scheme != "memory":
            raise BrokerURLError(f"not a memory URL: {url!r}")
        self._store = _STORES.setdefault(parts.netloc + parts.path, _Store())

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- helpers ---------------------------------------------------------------------------

    def _notify(self) -> None:
        if self._store.changed is not None:
            self._store.changed.set()
            self._store.changed = None

    def _owned(self, lease: Lease) -> _Record | None:
        rec = self._store.jobs.get(lease.job_id)
        if rec is None or rec.state is not JobState.RUNNING or rec.token != lease.token:
            return None
        return rec

    def _free_dedupe(self, rec: _Record) -> None:
        if rec.dedupe_key is not None and self._store.dedupe.get(rec.dedupe_key) == rec.id:
            del self._store.dedupe[rec.dedupe_key]

    def _lease(self, rec: _Record, lease_for: float, now: float) -> Delivery:
        rec.token = uuid.uuid4().hex
        rec.lease_until = now + lease_for
        rec.state = JobState.RUNNING
        return Delivery(
            Lease(rec.id, rec.token, rec.queue), rec.payload, rec.attempts, rec.lease_until
        )

    def _live(self, job_id: str, now: float) -> _Record | None:
        """The job, unless it is gone or kept past its time (then it is dropped now)."""
        rec = self._store.jobs.get(job_id)
        if rec is not None and rec.expires_at is not None and rec.expires_at <= now:
            del self._store.jobs[job_id]
            return None
        return rec

    def _expire_results(self, now: float) -> None:
        for rec in [r for r in self._store.jobs.values() if r.expires_at is not None]:
            self._live(rec.id, now)

    # -- producing -------------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[Job], now: float) -> list[str]:
        ids: list[str] = []
        for job in jobs:
            held = self._store.dedupe.get(job.dedupe_key) if job.dedupe_key else None
            if held is not None or job.id in self._store.jobs:
                ids.append(held or job.id)
                continue
            self._add(job.id, job.queue, job.to_wire(), now, job)
            ids.append(job.id)
        self._notify()
        return ids

    async def enqueue_raw(self, queue: str, payload: bytes | str, now: float) -> str:
        job_id = new_job_id()
        self._add(job_id, validate_queue_name(queue or DEFAULT_QUEUE), _as_text(payload), now, None)
        self._notify()
        return job_id

    def _add(
        self, job_id: str, queue: str, payload: str | bytes, now: float, job: Job | None
    ) -> None:
        self._store.seq += 1
        rec = _Record(
            id=job_id,
            queue=queue,
            payload=payload,
            run_at=now if job is None or job.run_at is None else job.run_at,
            priority=0 if job is None else job.priority,
            max_attempts=None if job is None else job.max_attempts,
            dedupe_key=None if job is None else job.dedupe_key,
            enqueued_at=now,
            seq=self._store.seq,
        )
        self._store.jobs[job_id] = rec
        self._push_pending(rec)
        if rec.dedupe_key is not None:
            self._store.dedupe[rec.dedupe_key] = job_id

    # -- consuming -------------------------------------------------------------------------

    async def reserve(
        self, queues: Sequence[str], limit: int, lease_for: float, wait: float, now: float
    ) -> list[Delivery]:
        started = time.monotonic()
        with anyio.move_on_after(wait):
            while True:
                got = self._take(queues, limit, lease_for, now + (time.monotonic() - started))
                if got or wait <= 0:
                    return got
                if self._store.changed is None:
                    self._store.changed = anyio.Event()
                await self._store.changed.wait()
        return []

    def _take(
        self, queues: Sequence[str], limit: int, lease_for: float, now: float
    ) -> list[Delivery]:
        out: list[Delivery] = []
        for queue in queues:
            if queue in self._store.paused or len(out) >= limit:
                continue
            for rec in self._pop_due(queue, limit - len(out), now):
                rec.attempts += 1
                rec.started_at, rec.progress = now, None
                out.append(self._lease(rec, lease_for, now))
        return out

    def _push_pending(self, rec: _Record) -> None:
        heapq.heappush(
            self._store.pending.setdefault(rec.queue, []),
            (-rec.priority, rec.run_at, rec.seq, rec.id),
        )

    def _pop_due(self, queue: str, limit: int, now: float) -> list[_Record]:
        """Up to ``limit`` due pending jobs, best first. Heap entries go stale when a job
        leaves pending or is rescheduled; those are dropped as they surface."""
        heap = self._store.pending.get(queue, [])
        due: list[_Record] = []
        later: list[tuple[int, float, int, str]] = []
        while heap and len(due) < limit:
            entry = heapq.heappop(heap)
            rec = self._store.jobs.get(entry[3])
            if rec is None or rec.state is not JobState.PENDING or rec.run_at != entry[1]:
                continue
            if rec.run_at <= now:
                due.append(rec)
            else:
                later.append(entry)
        for entry in later:
            heapq.heappush(heap, entry)
        return due

    async def extend(self, leases: Sequence[Lease], lease_for: float, now: float) -> list[Lease]:
        lost: list[Lease] = []
        for lease in leases:
            rec = self._owned(lease)
            if rec is None:
                lost.append(lease)
            else:
                rec.lease_until = now + lease_for
        return lost

    async def settle(self, items: Sequence[tuple[Lease, Outcome]], now: float) -> list[bool]:
        applied = [self._settle_one(lease, outcome, now) for lease, outcome in items]
        self._notify()
        return applied

    def _settle_one(self, lease: Lease, outcome: Outcome, now: float) -> bool:
        rec = self._owned(lease)
        if rec is None:
            return False
        rec.token = None
        if isinstance(outcome, Complete):
            self._free_dedupe(rec)
            if outcome.keep_until is None:
                del self._store.jobs[rec.id]
            else:
                rec.state, rec.result, rec.finished_at = JobState.DONE, outcome.result, now
                rec.expires_at = outcome.keep_until
        elif isinstance(outcome, Retry):
            rec.state, rec.run_at, rec.last_error = JobState.PENDING, outcome.run_at, outcome.error
            self._push_pending(rec)
            if not outcome.charge_attempt:
                rec.attempts = max(0, rec.attempts - 1)
        elif isinstance(outcome, DeadLetter):
            self._free_dedupe(rec)
            rec.state, rec.last_error, rec.finished_at = JobState.DEAD, outcome.error, now
            task = peek_task(rec.payload)
            key = dead_alert_key(rec.queue, task)
            self._record_alert(AlertEvent(key, "dead", rec.queue, task, rec.id, outcome.error), now)
        return True

    async def release(self, leases: Sequence[Lease], now: float) -> None:
        for lease in leases:
            rec = self._owned(lease)
            if rec is not None:
                rec.state, rec.token, rec.run_at = JobState.PENDING, None, now
                self._push_pending(rec)
                rec.attempts = max(0, rec.attempts - 1)
        self._notify()

    async def reclaim_expired(
        self, queues: Sequence[str], lease_for: float, limit: int, now: float
    ) -> list[Delivery]:
        self._expire_results(now)  # the periodic pass that drops kept jobs past their time
        expired = [
            r
            for r in self._store.jobs.values()
            if r.state is JobState.RUNNING and r.queue in queues and r.lease_until < now
        ][:limit]
        return [self._lease(rec, lease_for, now) for rec in expired]

    # -- admin -----------------------------------------------------------------------------

    def _info(self, rec: _Record, now: float) -> JobInfo:
        state = rec.state
        if state is JobState.PENDING and rec.run_at > now:
            state = JobState.SCHEDULED
        return JobInfo(
            id=rec.id,
            queue=rec.queue,
            state=state,
            task=peek_task(rec.payload),
            attempts=rec.attempts,
            payload=rec.payload,
            max_attempts=rec.max_attempts,
            priority=rec.priority,
            run_at=rec.run_at,
            enqueued_at=rec.enqueued_at,
            finished_at=rec.finished_at,
            last_error=rec.last_error,
            result=rec.result,
            dedupe_key=rec.dedupe_key,
            started_at=rec.started_at,
            progress=rec.progress,
        )

    async def get_job(self, job_id: str, now: float) -> JobInfo | None:
        rec = self._live(job_id, now)
        return None if rec is None else self._info(rec, now)

    async def stats(self, now: float) -> dict[str, QueueStats]:
        out: dict[str, QueueStats] = {q: QueueStats(paused=True) for q in self._store.paused}
        for rec in self._store.jobs.values():
            st = out.setdefault(rec.queue, QueueStats(paused=rec.queue in self._store.paused))
            if rec.state is JobState.PENDING:
                if rec.run_at <= now:
                    st.ready += 1
                    if st.oldest_ready_at is None or rec.run_at < st.oldest_ready_at:
                        st.oldest_ready_at = rec.run_at
                else:
                    st.scheduled += 1
            elif rec.state is JobState.RUNNING:
                st.running += 1
            elif rec.state is JobState.DEAD:
                st.dead += 1
        return out

    def _dead(self, ids: Sequence[str] | None, queue: str | None) -> list[_Record]:
        pool = (
            self._store.jobs.values()
            if ids is None
            else [r for i in ids if (r := self._store.jobs.get(i)) is not None]
        )
        return [r for r in pool if r.state is JobState.DEAD and (queue is None or r.queue == queue)]

    async def list_dead(self, queue: str | None, limit: int) -> list[JobInfo]:
        dead = sorted(self._dead(None, queue), key=lambda r: -(r.finished_at or 0))
        return [self._info(r, 0.0) for r in dead[:limit]]

    async def requeue_dead(
        self, ids: Sequence[str] | None, queue: str | None, now: float
    ) -> list[str]:
        out: list[str] = []
        for rec in self._dead(ids, queue):
            if rec.dedupe_key is not None:
                if rec.dedupe_key in self._store.dedupe:
                    continue  # another job took the key meanwhile; leave this one dead
                self._store.dedupe[rec.dedupe_key] = rec.id
            rec.state, rec.attempts, rec.run_at, rec.finished_at = JobState.PENDING, 0, now, None
            self._push_pending(rec)
            out.append(rec.id)
        self._notify()
        return out

    async def purge_dead(self, ids: Sequence[str] | None, queue: str | None) -> int:
        dead = self._dead(ids, queue)
        for rec in dead:
            del self._store.jobs[rec.id]
        return len(dead)

    async def cancel(self, job_id: str, keep_until: float, now: float) -> JobState | None:
        rec = self._live(job_id, now)
        if rec is None:
            return None
        if rec.state is JobState.PENDING:
            self._free_dedupe(rec)
            rec.state, rec.finished_at, rec.expires_at = JobState.CANCELLED, now, keep_until
        return rec.state

    async def set_progress(self, lease: Lease, progress: str, now: float) -> bool:
        rec = self._owned(lease)
        if rec is None:
            return False
        rec.progress = progress
        return True

    async def set_paused(self, queue: str, paused: bool) -> None:
        validate_queue_name(queue)
        if paused:
            self._store.paused.add(queue)
        else:
            self._store.paused.discard(queue)
            self._notify()

    # -- the alert outbox ------------------------------------------------------------------

    def _record_alert(self, event: AlertEvent, now: float) -> None:
        row = self._store.alerts.get(event.key)
        detail = event.detail[:ALERT_DETAIL_LIMIT]
        if row is None:
            row = Alert(
                event.key,
                event.kind,
                event.queue,
                event.task,
                event.job_id,
                detail,
                count=0,
                first_at=now,
                last_at=now,
                next_at=now,
            )
            self._store.alerts[event.key] = row
        if row.count == 0:
            row.first_at, row.next_at = now, max(row.next_at, now)
        row.count += 1
        row.last_at = now
        row.kind, row.queue, row.task = event.kind, event.queue, event.task
        row.job_id, row.detail = event.job_id, detail

    async def record_alert(self, event: AlertEvent, now: float) -> None:
        self._record_alert(event, now)

    async def claim_alerts(self, limit: int, lease_for: float, now: float) -> list[Alert]:
        due = sorted(
            (a for a in self._store.alerts.values() if a.count > 0 and a.next_at <= now),
            key=lambda a: a.next_at,
        )[:limit]
        for row in due:
            row.token, row.next_at = uuid.uuid4().hex, now + lease_for
        return [replace(row) for row in due]

    async def finish_alert(
        self, alert: Alert, sent: bool, next_at: float, error: str | None, now: float
    ) -> bool:
        row = self._store.alerts.get(alert.key)
        if row is None or row.token is None or row.token != alert.token:
            return False
        row.token, row.next_at = None, next_at
        if sent:
            row.count = max(0, row.count - alert.count)
            row.attempts, row.last_error, row.sent_at = 0, None, now
        else:
            row.attempts, row.last_error = row.attempts + 1, error
        return True

    async def list_alerts(self, pending_only: bool, limit: int) -> list[Alert]:
        rows = [a for a in self._store.alerts.values() if a.count > 0 or not pending_only]
        return [replace(a) for a in sorted(rows, key=lambda a: a.first_at)[:limit]]

    # -- flow control ----------------------------------------------------------------------

    async def acquire_rate(self, key: str, interval: float, now: float) -> float:
        free_at = self._store.rates.get(key, now)
        if now < free_at:
            return free_at - now
        self._store.rates[key] = now + interval
        return 0.0

    async def acquire_slot(self, key: str, holder: str, limit: int, ttl: float, now: float) -> bool:
        held = self._store.slots.setdefault(key, {})
        for other, expiry in list(held.items()):
            if expiry < now:
                del held[other]
        if holder not in held and len(held) >= limit:
            return False
        held[holder] = now + ttl
        return True

    async def extend_slots(self, slots: Sequence[tuple[str, str]], ttl: float, now: float) -> None:
        for key, holder in slots:
            held = self._store.slots.get(key, {})
            if holder in held:
                held[holder] = now + ttl

    async def release_slots(self, slots: Sequence[tuple[str, str]]) -> None:
        for key, holder in slots:
            self._store.slots.get(key, {}).pop(holder, None)
