"""SqliteBroker: the embedded default (``sqlite:///path/to/file.db``), no server needed.

One file holds the queue; several worker processes on one machine share it. The database runs in
WAL mode so readers never block the writer, and every claim and settle is one ``BEGIN IMMEDIATE``
transaction, so two processes can never claim the same row. The statements and the table layout
live in ``sqlite.sql``.

URL options (query string): ``synchronous=full|normal`` (default ``full``: a committed job
survives a power cut; ``normal`` is faster and survives a process crash, not an OS crash).

The alert outbox, rate limits and concurrency slots live in the same file, so every worker process
on it shares them; each acquire is one ``BEGIN IMMEDIATE`` transaction, atomic across processes.

The file carries its schema version in ``PRAGMA user_version``; connecting upgrades an older file
in place (see the list of versions in ``sqlite.sql``).

sqlite3 is blocking, so each broker runs its statements on a worker thread, one at a time.
Waiting for work polls ``PRAGMA data_version`` (cheap, takes no lock), which changes whenever
another connection commits; producers in the same process wake waiters directly.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import anyio

from taskkit.broker import Broker, redact_url
from taskkit.errors import BrokerError, BrokerUnavailable, BrokerURLError
from taskkit.job import (
    ALERT_DETAIL_LIMIT,
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

T = TypeVar("T")


def _load_sql() -> dict[str, str]:
    text = (Path(__file__).with_name("sqlite.sql")).read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    name: str | None = None
    for line in text.splitlines():
        if line.startswith("-- name: "):
            name = line.removeprefix("-- name: ").strip()
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    return {k: v.strip() for k, v in sections.items()}


SQL = _load_sql()

# Wakes waiters in this process as soon as a job is enqueued on the same file.
_LOCAL_WAKEUPS: dict[str, set[anyio.Event]] = {}
_POLL_MIN, _POLL_MAX = 0.002, 0.05
# The schema this code writes (PRAGMA user_version); sqlite.sql lists what each version added.
SCHEMA_VERSION = 2
# A delivered alert row is kept this long past the end of its quiet window, and a rate row past
# its free time, then dropped: a new event or acquire on the key behaves as if there were no row.
_IDLE_ROW_KEEP = 86_400.0


class SqliteBroker(Broker):
    """Jobs in one SQLite file; see the module docstring."""

    def __init__(self, url: str = "sqlite:///taskkit.db", **options: Any) -> None:
        super().__init__(url)
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc not in ("", "localhost"):
            raise BrokerURLError(
                f"invalid SQLite URL {redact_url(url)!r}: use sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path:
            raise BrokerURLError(f"SQLite URL {url!r} names no file: use sqlite:///taskkit.db")
        self.path = str(Path(path).resolve()) if path != ":memory:" else path
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self._synchronous = query.get("synchronous", options.get("synchronous", "full")).upper()
        if self._synchronous not in ("FULL", "NORMAL"):
            raise BrokerURLError("synchronous must be 'full' or 'normal'")
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)

    # -- plumbing ----------------------------------------------------------------------------

    async def connect(self) -> None:
        if self._conn is not None:
            return
        try:
            self._conn = await anyio.to_thread.run_sync(self._open)
        except sqlite3.Error as exc:
            raise BrokerUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA busy_timeout=30000")
        with _immediate(conn):
            _upgrade(conn)
        return conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await anyio.to_thread.run_sync(conn.close, limiter=self._limiter)

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise BrokerError(f"{self!r} is not connected: use 'async with broker:' first")

        def run() -> T:
            try:
                return fn(conn)
            except sqlite3.Error as exc:
                raise BrokerError(f"SQLite error on {self.path}: {exc}") from exc

        return await anyio.to_thread.run_sync(run, limiter=self._limiter)

    def _wake_local(self) -> None:
        for event in _LOCAL_WAKEUPS.pop(self.path, set()):
            event.set()

    # -- producing -------------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[Job], now: float) -> list[str]:
        if not jobs:
            return []

        def tx(conn: sqlite3.Connection) -> list[str]:
            ids: list[str] = []
            with _immediate(conn):
                for job in jobs:
                    if conn.execute(SQL["exists"], (job.id,)).fetchone():
                        ids.append(job.id)
                        continue
                    if job.dedupe_key is not None:
                        row = conn.execute(SQL["find_active_dedupe"], (job.dedupe_key,)).fetchone()
                        if row is not None:
                            ids.append(row[0])
                            continue
                    run_at = now if job.run_at is None else job.run_at
                    conn.execute(
                        SQL["insert"],
                        (
                            job.id,
                            job.queue,
                            job.task,
                            job.priority,
                            run_at,
                            job.max_attempts,
                            job.to_wire(),
                            job.dedupe_key,
                            now,
                        ),
                    )
                    ids.append(job.id)
            return ids

        ids = await self._call(tx)
        self._wake_local()
        return ids

    async def enqueue_raw(self, queue: str, payload: bytes | str, now: float) -> str:
        validate_queue_name(queue)
        text: str | bytes = payload
        if isinstance(payload, bytes):
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                pass  # stored as a BLOB, so the worker can say what is wrong with it
        job_id = new_job_id()

        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(
                    SQL["insert"], (job_id, queue, peek_task(text), 0, now, None, text, None, now)
                )

        await self._call(tx)
        self._wake_local()
        return job_id

    # -- consuming -------------------------------------------------------------------------

    async def reserve(
        self, queues: Sequence[str], limit: int, lease_for: float, wait: float, now: float
    ) -> list[Delivery]:
        started = time.monotonic()
        deadline = started + max(0.0, wait)
        pause = _POLL_MIN
        while True:
            claim = functools.partial(
                self._claim,
                queues=queues,
                limit=limit,
                lease_for=lease_for,
                now=now + (time.monotonic() - started),
            )
            got, version = await self._call(claim)
            if got or time.monotonic() >= deadline:
                return got
            # Sleep until someone in this process enqueues, or poll for other processes' commits.
            event = anyio.Event()
            _LOCAL_WAKEUPS.setdefault(self.path, set()).add(event)
            while time.monotonic() < deadline and not event.is_set():
                with anyio.move_on_after(min(pause, deadline - time.monotonic())):
                    await event.wait()
                new_version = await self._call(_data_version)
                if new_version != version:
                    version = new_version
                    break
                pause = min(pause * 2, _POLL_MAX)
                # Scheduled jobs come due without anyone committing: try again now and then.
                if pause >= _POLL_MAX:
                    break
            _LOCAL_WAKEUPS.get(self.path, set()).discard(event)

    def _claim(
        self,
        conn: sqlite3.Connection,
        queues: Sequence[str],
        limit: int,
        lease_for: float,
        now: float,
    ) -> tuple[list[Delivery], int]:
        """The claimed jobs, and the data_version the claim saw (read under the write lock, so
        no other commit can slip in between; a waiting reserve watches it for new work)."""
        out: list[Delivery] = []
        with _immediate(conn):
            for queue in queues:
                if len(out) >= limit:
                    break
                if conn.execute(SQL["is_paused"], (queue,)).fetchone():
                    continue
                rows = conn.execute(
                    SQL["claim"],
                    {
                        "queue": queue,
                        "now": now,
                        "limit": limit - len(out),
                        "lease_until": now + lease_for,
                    },
                ).fetchall()
                rows.sort(key=lambda r: (-r[6], r[7], r[8]))  # RETURNING has no order
                out.extend(Delivery(Lease(r[0], r[4], r[1]), r[2], r[3], r[5]) for r in rows)
            version = _data_version(conn)
        return out, version

    async def extend(self, leases: Sequence[Lease], lease_for: float, now: float) -> list[Lease]:
        if not leases:
            return []

        def tx(conn: sqlite3.Connection) -> list[Lease]:
            with _immediate(conn):
                return [
                    lease
                    for lease in leases
                    if conn.execute(
                        SQL["extend"], (now + lease_for, lease.job_id, lease.token)
                    ).rowcount
                    == 0
                ]

        return await self._call(tx)

    async def settle(self, items: Sequence[tuple[Lease, Outcome]], now: float) -> list[bool]:
        if not items:
            return []

        def tx(conn: sqlite3.Connection) -> list[bool]:
            with _immediate(conn):
                return [_settle_one(conn, lease, outcome, now) for lease, outcome in items]

        applied = await self._call(tx)
        self._wake_local()
        return applied

    async def release(self, leases: Sequence[Lease], now: float) -> None:
        if not leases:
            return

        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.executemany(SQL["release"], [(now, ls.job_id, ls.token) for ls in leases])

        await self._call(tx)
        self._wake_local()

    async def reclaim_expired(
        self, queues: Sequence[str], lease_for: float, limit: int, now: float
    ) -> list[Delivery]:
        def tx(conn: sqlite3.Connection) -> list[Delivery]:
            out: list[Delivery] = []
            with _immediate(conn):
                # Every worker's recovery loop comes here now and then: the place to drop kept
                # results and cancelled jobs whose time is up, alert rows long delivered, slots
                # whose holder died and rate keys idle for a day (of tasks renamed or gone).
                # Small indexed deletes (rates: a scan of a few rows), nearly free when idle.
                conn.execute(SQL["purge_expired_results"], (now,))
                conn.execute(SQL["purge_quiet_alerts"], (now - _IDLE_ROW_KEEP,))
                conn.execute(SQL["purge_expired_slots"], (now,))
                conn.execute(SQL["purge_idle_rates"], (now - _IDLE_ROW_KEEP,))
                for queue in queues:
                    rows = conn.execute(
                        SQL["reclaim"],
                        {
                            "queue": queue,
                            "now": now,
                            "limit": limit - len(out),
                            "lease_until": now + lease_for,
                        },
                    ).fetchall()
                    out.extend(Delivery(Lease(r[0], r[4], r[1]), r[2], r[3], r[5]) for r in rows)
                    if len(out) >= limit:
                        break
            return out

        return await self._call(tx)

    # -- admin -----------------------------------------------------------------------------

    async def get_job(self, job_id: str, now: float) -> JobInfo | None:
        row = await self._call(lambda c: c.execute(SQL["get"], (job_id,)).fetchone())
        if row is None or (row["expires_at"] is not None and row["expires_at"] <= now):
            return None
        return _info(row, now)

    async def stats(self, now: float) -> dict[str, QueueStats]:
        def read(conn: sqlite3.Connection) -> dict[str, QueueStats]:
            out = {
                q: QueueStats(
                    ready=r or 0, scheduled=s or 0, running=n or 0, dead=d or 0, oldest_ready_at=o
                )
                for q, r, s, n, d, o in conn.execute(SQL["stats"], {"now": now})
            }
            for (queue,) in conn.execute(SQL["paused"]):
                out.setdefault(queue, QueueStats()).paused = True
            return out

        return await self._call(read)

    async def list_dead(self, queue: str | None, limit: int) -> list[JobInfo]:
        rows = await self._call(
            lambda c: c.execute(SQL["list_dead"], {"queue": queue, "limit": limit}).fetchall()
        )
        return [_info(r, 0.0) for r in rows]

    def _select_dead(
        self, conn: sqlite3.Connection, ids: Sequence[str] | None, queue: str | None
    ) -> list[tuple[str, str | None]]:
        rows: list[tuple[str, str | None]] = conn.execute(
            SQL["select_dead"], {"queue": queue}
        ).fetchall()
        if ids is not None:
            wanted = set(ids)
            rows = [r for r in rows if r[0] in wanted]
        return rows

    async def requeue_dead(
        self, ids: Sequence[str] | None, queue: str | None, now: float
    ) -> list[str]:
        def tx(conn: sqlite3.Connection) -> list[str]:
            done: list[str] = []
            with _immediate(conn):
                for job_id, key in self._select_dead(conn, ids, queue):
                    if (
                        key is not None
                        and conn.execute(SQL["find_active_dedupe"], (key,)).fetchone()
                    ):
                        continue  # another job holds the key now; this one stays dead
                    conn.execute(SQL["requeue"], (now, job_id))
                    done.append(job_id)
            return done

        done = await self._call(tx)
        self._wake_local()
        return done

    async def purge_dead(self, ids: Sequence[str] | None, queue: str | None) -> int:
        def tx(conn: sqlite3.Connection) -> int:
            with _immediate(conn):
                rows = self._select_dead(conn, ids, queue)
                conn.executemany(SQL["purge"], [(r[0],) for r in rows])
                return len(rows)

        return await self._call(tx)

    async def cancel(self, job_id: str, keep_until: float, now: float) -> JobState | None:
        def tx(conn: sqlite3.Connection) -> JobState | None:
            with _immediate(conn):
                conn.execute(SQL["cancel"], (now, keep_until, job_id))
                row = conn.execute(SQL["state_of"], (job_id,)).fetchone()
            if row is None or (row["expires_at"] is not None and row["expires_at"] <= now):
                return None
            return JobState(row["state"])

        return await self._call(tx)

    async def set_progress(self, lease: Lease, progress: str, now: float) -> bool:
        def tx(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                cur = conn.execute(SQL["set_progress"], (progress, lease.job_id, lease.token))
                return cur.rowcount == 1

        return await self._call(tx)

    async def set_paused(self, queue: str, paused: bool) -> None:
        validate_queue_name(queue)

        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.execute(SQL["pause" if paused else "resume"], (queue,))

        await self._call(tx)
        if not paused:
            self._wake_local()

    # -- the alert outbox ------------------------------------------------------------------

    async def record_alert(self, event: AlertEvent, now: float) -> None:
        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                _record_alert(conn, event, now)

        await self._call(tx)

    async def claim_alerts(self, limit: int, lease_for: float, now: float) -> list[Alert]:
        if limit <= 0:
            return []

        def tx(conn: sqlite3.Connection) -> list[Alert]:
            # Every worker polls here and nearly every poll finds nothing due: answer those from
            # a plain read (WAL readers take no lock) instead of queueing for the write lock.
            if not conn.execute(SQL["due_alerts"], {"now": now, "limit": 1}).fetchall():
                return []
            with _immediate(conn):
                # Read again under the lock: another process may have claimed them meanwhile.
                due = conn.execute(SQL["due_alerts"], {"now": now, "limit": limit}).fetchall()
                # One UPDATE per key, in due order: RETURNING would only show the new next_at,
                # which is the same for all of them, so it cannot say which was due first.
                return [
                    _alert(
                        conn.execute(
                            SQL["claim_alert"], {"key": key, "lease_until": now + lease_for}
                        ).fetchall()[0]
                    )
                    for (key,) in due
                ]

        return await self._call(tx)

    async def finish_alert(
        self, alert: Alert, sent: bool, next_at: float, error: str | None, now: float
    ) -> bool:
        if alert.token is None:
            return False  # never claimed, so it holds nothing to finish
        params = {
            "key": alert.key,
            "token": alert.token,
            "next_at": next_at,
            "count": alert.count,
            "error": error,
            "now": now,
        }

        def tx(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                name = "finish_alert_sent" if sent else "finish_alert_failed"
                return conn.execute(SQL[name], params).rowcount == 1

        return await self._call(tx)

    async def list_alerts(self, pending_only: bool, limit: int) -> list[Alert]:
        rows = await self._call(
            lambda c: c.execute(
                SQL["list_alerts"], {"pending_only": pending_only, "limit": limit}
            ).fetchall()
        )
        return [_alert(r) for r in rows]

    # -- flow control shared by every worker -------------------------------------------------

    async def acquire_rate(self, key: str, interval: float, now: float) -> float:
        def tx(conn: sqlite3.Connection) -> float:
            with _immediate(conn):
                params = {"key": key, "free_at": now + interval, "now": now}
                if conn.execute(SQL["acquire_rate"], params).rowcount == 1:
                    return 0.0
                # Refused: the row exists and its free time is ahead (the upsert changed nothing).
                (free_at,) = conn.execute(SQL["rate_free_at"], (key,)).fetchall()[0]
            return max(0.0, float(free_at) - now)

        return await self._call(tx)

    async def acquire_slot(self, key: str, holder: str, limit: int, ttl: float, now: float) -> bool:
        params = {"key": key, "holder": holder, "limit": limit, "expires_at": now + ttl}

        def tx(conn: sqlite3.Connection) -> bool:
            with _immediate(conn):
                conn.execute(SQL["drop_expired_holders"], (key, now))
                return conn.execute(SQL["acquire_slot"], params).rowcount == 1

        return await self._call(tx)

    async def extend_slots(self, slots: Sequence[tuple[str, str]], ttl: float, now: float) -> None:
        if not slots:
            return

        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.executemany(SQL["extend_slot"], [(now + ttl, k, h) for k, h in slots])

        await self._call(tx)

    async def release_slots(self, slots: Sequence[tuple[str, str]]) -> None:
        if not slots:
            return

        def tx(conn: sqlite3.Connection) -> None:
            with _immediate(conn):
                conn.executemany(SQL["release_slot"], list(slots))

        await self._call(tx)


class _immediate:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error): takes the write lock up front,
    so a read-then-write never races another process."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT our open transaction; run the statements one by one instead.
    for statement in script.split(";"):
        if statement.strip():
            conn.execute(statement)


# Columns added after the first release of the table, created on older files at connect.
_LATER_COLUMNS = {"started_at": "REAL", "progress": "TEXT"}


def _upgrade(conn: sqlite3.Connection) -> None:
    """Bring a file older than SCHEMA_VERSION (or a new, empty one) up to it, inside the caller's
    transaction. Every schema statement is idempotent, so a file at any older version gains just
    what it lacks; a current file is left alone, so connecting costs one read."""
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) >= SCHEMA_VERSION:
        return
    _run_script(conn, SQL["schema"])
    _add_missing_columns(conn)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    have = {row["name"] for row in conn.execute("PRAGMA table_info(jobs)")}
    for name, kind in _LATER_COLUMNS.items():
        if name not in have:
            conn.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")


def _data_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])


def _settle_one(conn: sqlite3.Connection, lease: Lease, outcome: Outcome, now: float) -> bool:
    key = (lease.job_id, lease.token)
    if isinstance(outcome, Complete):
        if outcome.keep_until is None:
            cur = conn.execute(SQL["complete_delete"], key)
        else:
            cur = conn.execute(
                SQL["complete_keep"], (outcome.result, outcome.keep_until, now, *key)
            )
    elif isinstance(outcome, Retry):
        refund = 0 if outcome.charge_attempt else 1
        cur = conn.execute(SQL["retry"], (outcome.run_at, outcome.error, refund, *key))
    elif isinstance(outcome, DeadLetter):
        # Only a dead letter costs a second statement: its alert, in this same transaction, so
        # a dead job is never without its alert nor an alert without its dead job.
        rows = conn.execute(SQL["dead"], (outcome.error, now, *key)).fetchall()
        if not rows:
            return False
        queue, task = rows[0]
        event = AlertEvent(
            dead_alert_key(queue, task), "dead", queue, task, lease.job_id, outcome.error
        )
        _record_alert(conn, event, now)
        return True
    else:  # pragma: no cover - Outcome is a closed union
        raise TypeError(f"unknown outcome {outcome!r}")
    return cur.rowcount == 1


def _record_alert(conn: sqlite3.Connection, event: AlertEvent, now: float) -> None:
    conn.execute(
        SQL["record_alert"],
        {
            "key": event.key,
            "kind": event.kind,
            "queue": event.queue,
            "task": event.task,
            "job_id": event.job_id,
            "detail": event.detail[:ALERT_DETAIL_LIMIT],
            "now": now,
        },
    )


def _alert(row: sqlite3.Row) -> Alert:
    return Alert(**{k: row[k] for k in row.keys()})


def _info(row: sqlite3.Row, now: float) -> JobInfo:
    state = JobState(row["state"])
    if state is JobState.PENDING and row["run_at"] > now:
        state = JobState.SCHEDULED
    fields = {k: row[k] for k in row.keys() if k not in ("state", "expires_at")}
    return JobInfo(state=state, **fields)
