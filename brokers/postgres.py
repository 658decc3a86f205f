"""PostgresBroker: jobs in a PostgreSQL table, claimed with ``FOR UPDATE SKIP LOCKED`` (asyncpg).

URL: ``postgresql://user:password@host:5432/dbname?schema=taskkit`` (``postgres://`` works too).
Query parameters taskkit reads, and removes before the URL reaches asyncpg (every other one,
``sslmode`` for example, is passed on):

- ``schema=NAME``: the schema holding taskkit's tables (default ``taskkit``); letters, digits
  and ``_``, at most 48 characters. Several schemas in one database are independent brokers.
- ``listen=0``: do not LISTEN for wake-ups; idle workers poll instead (every
  ``poll_interval``, 1 s by default).
- ``prepared=0``: no named prepared statements (``statement_cache_size=0``). Together with
  ``listen=0`` this is the mode for PgBouncer in transaction pooling.
- ``pool_size=N``: connections in the pool (default 10).

The tables are created by ``taskkit migrate --broker URL`` (``PostgresBroker.migrate``); the
layout is documented in ``postgres_migrations.sql`` and the queries in ``postgres_queries.sql``.

Transactional enqueue: ``await broker.enqueue_in(conn, jobs, now)`` inserts with your asyncpg
connection, inside your transaction: the jobs exist (and idle workers are woken) only if it
commits::

    async with conn.transaction():
        await conn.execute("INSERT INTO orders ...")
        await broker.enqueue_in(conn, [Job(task="orders.confirm", args=[order_id])], time.time())

Foreign producers (psql, triggers, other languages) call the SQL function ``<schema>.enqueue``,
which writes a version-1 wire payload, honours dedupe keys, notifies idle workers and returns the
job id::

    SELECT taskkit.enqueue('emails.send', '["a@example.com"]'::jsonb);
    SELECT taskkit.enqueue('reports.build', kwargs => '{"id": 42}', queue => 'reports',
                           priority => 5, run_at => now() + interval '10 minutes',
                           max_attempts => 3, dedupe_key => 'report:42');

Wake-ups: every statement that makes jobs runnable sends one ``pg_notify`` per queue on the
channel ``taskkit.<schema>`` (payload: the queue name). A ``reserve`` with nothing due listens on
a dedicated connection (re-armed after a reconnect) and claims again when its queues are
notified, or after a short poll interval, which also picks up scheduled jobs as they come due.
A retry due within a few seconds (a job snoozed by a rate or concurrency limit, a short backoff)
is announced at settle as ``<queue> <run_at>``: every listener wakes its waiters of that queue
at that time, so the fleet picks the job up when it comes due rather than at its next poll
(which would let whichever worker polls first take every snoozed job, one poll at a time).

Alerts and flow control: a dead letter records its alert (see ``Broker.settle``) in the settle
statement itself, so the two commit together; the alert outbox, the rate-limit and the
concurrency-slot tables, and how each is kept consistent under concurrent workers, are described
in ``postgres_migrations.sql``. Like every other time, their times are the caller's ``now``.

Connection trouble (the server restarts, fails over or drops connections): the call that meets it
raises ``BrokerUnavailable``, one line naming the server without its password, and every pooled
connection is replaced on its next use (asyncpg may otherwise hand out a connection the server has
already closed). The worker backs off and calls again; the pool reconnects then. A lost LISTEN
connection is re-armed by the next ``reserve``, retrying 0.25 s after a failure, doubling up to
5 s, polling meanwhile. A claim or settle cut off mid-statement is rolled back by the server, or
committed with its answer lost: then the lease runs out and the job is reclaimed and rerun
(at-least-once), never lost.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import asyncpg

from taskkit.broker import Broker, redact_url
from taskkit.errors import (
    BrokerError,
    BrokerUnavailable,
    BrokerURLError,
    SchemaMissing,
    TaskkitError,
)
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
    new_job_id,
    peek_task,
    validate_queue_name,
)
from taskkit.outcome import Complete, DeadLetter, Outcome, Retry

__all__ = ["LATEST_VERSION", "VERSIONS", "PostgresBroker", "PostgresURL", "parse_url"]

log = logging.getLogger("taskkit.brokers.postgres")

DEFAULT_SCHEMA = "taskkit"
DEFAULT_POOL_SIZE = 10
# 48 leaves room for the "taskkit." channel prefix within PostgreSQL's 63-byte identifiers.
_SCHEMA_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,47}$")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_CONNECT_TIMEOUT = 10.0
# After a failed LISTEN connection, poll (and retry it) after 0.25 s, doubling up to 5 s.
_LISTEN_RETRY_FIRST = 0.25
_LISTEN_RETRY = 5.0
_PRUNE_EVERY = 10.0  # seconds of the caller's clock between prunes of expired results
_PRUNE_BATCH = 1000
# Delivered alerts, idle rate keys and expired slots are kept this long before the prune drops
# them: a day of alert history for `taskkit alerts list`, and far beyond any clock skew between
# workers, so a row one of them still counts on is never pruned from under it.
_PRUNE_IDLE_AFTER = 86_400.0
_RACE_RETRIES = 3
_WRITE_TIMEOUT = 30.0  # bound on a shielded write (see _write)
_RATE_RETRY = 0.05  # the wait acquire_rate answers when it could not read the next free time
# Retries due within this many seconds are announced with their run time (see the docstring).
_ANNOUNCE_AHEAD = 5.0
# A timed wake-up fires this much after the run time: asyncio timers may fire a little early and
# hosts' clocks differ a little, and a claim just before the job is due finds nothing and goes
# back to its poll interval.
_DUE_SLACK = 0.02

# Driver errors that mean "the connection broke": the server went away or restarted, or the
# driver lost track of the protocol on a connection the server was closing. Every pooled
# connection is suspect after one of these (see PostgresBroker._drop_connections).
_BROKEN: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,  # ConnectionDoesNotExistError, ConnectionFailureError, ...
    asyncpg.CannotConnectNowError,  # starting up, shutting down, in recovery
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InternalClientError,
)
# Driver errors that mean "the server cannot be reached or used right now".
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    *_BROKEN,
    asyncpg.TooManyConnectionsError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.InvalidAuthorizationSpecificationError,
)
_MISSING: tuple[type[BaseException], ...] = (
    asyncpg.UndefinedTableError,
    asyncpg.InvalidSchemaNameError,
)
_MIN_SERVER = 13  # gen_random_uuid() in core
# States whose rows are dropped at expires_at; past it they count as gone.
_EXPIRING = frozenset({JobState.DONE, JobState.CANCELLED})


# -- SQL files -----------------------------------------------------------------------------------


def _sections(filename: str, marker: str) -> dict[str, str]:
    """Split a .sql file into its ``-- <marker>: NAME`` sections, in file order."""
    text = (Path(__file__).parent / filename).read_text(encoding="utf-8")
    prefix = f"-- {marker}:"
    out: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), f"{prefix} <end>"]:
        if line.startswith(prefix):
            if name is not None:
                out[name] = "\n".join(lines).strip()
            name, lines = line[len(prefix) :].strip(), []
        elif name is not None:
            lines.append(line)
    return out


_QUERIES = _sections("postgres_queries.sql", "name")
_MIGRATIONS = _sections("postgres_migrations.sql", "migration")
VERSIONS = tuple(_MIGRATIONS)
"""Every schema version this code knows, in the order they are applied."""
LATEST_VERSION = VERSIONS[-1]
"""The newest schema version this code knows (and needs)."""


class _SQL:
    """The queries and migrations rendered for one schema."""

    def __init__(self, schema: str) -> None:
        quoted, channel = f'"{schema}"', f"taskkit.{schema}"

        def render(sql: str) -> str:
            return sql.replace("{schema}", quoted).replace("{channel}", channel)

        self.q = {name: render(sql) for name, sql in _QUERIES.items()}
        self.migrations = [(version, render(sql)) for version, sql in _MIGRATIONS.items()]


# -- URL -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresURL:
    """A broker URL split into what asyncpg gets (``dsn``) and taskkit's own options."""

    dsn: str
    schema: str = DEFAULT_SCHEMA
    listen: bool = True
    prepared: bool = True
    pool_size: int = DEFAULT_POOL_SIZE

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel of this schema."""
        return f"taskkit.{self.schema}"


def parse_url(url: str) -> PostgresURL:
    """Split ``url`` into the asyncpg DSN and taskkit's options; BrokerURLError when invalid."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise BrokerURLError(f"cannot parse PostgreSQL URL {redact_url(url)}: {exc}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise BrokerURLError(f"not a PostgreSQL URL: {redact_url(url)}")
    options: dict[str, str] = {}
    kept: list[str] = []
    for piece in parts.query.split("&") if parts.query else []:
        key, _, value = piece.partition("=")
        if unquote(key) in ("schema", "listen", "prepared", "pool_size"):
            options[unquote(key)] = unquote(value)
        else:
            kept.append(piece)
    dsn = urlunsplit(parts._replace(query="&".join(kept)))
    schema = options.get("schema", DEFAULT_SCHEMA)
    if not _SCHEMA_RE.match(schema):
        raise BrokerURLError(
            f"invalid schema {schema!r} in {redact_url(url)}: use 1-48 letters, digits or _, "
            "not starting with a digit"
        )
    return PostgresURL(
        dsn=dsn,
        schema=schema,
        listen=_flag(options, "listen", url),
        prepared=_flag(options, "prepared", url),
        pool_size=_pool_size(options.get("pool_size"), url),
    )


def _flag(options: dict[str, str], key: str, url: str) -> bool:
    value = options.get(key, "1").lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise BrokerURLError(f"invalid {key}={value!r} in {redact_url(url)}: use 0 or 1")


def _pool_size(value: str | None, url: str) -> int:
    if value is None:
        return DEFAULT_POOL_SIZE
    if not value.isdigit() or int(value) < 1:
        raise BrokerURLError(f"invalid pool_size={value!r} in {redact_url(url)}: use a number >= 1")
    return int(value)


# -- rows ----------------------------------------------------------------------------------------


# The enqueue statement's columns, in its parameter order ($1..$8): ids, queues, tasks,
# priorities, run_at, max_attempts, payloads, dedupe keys.
_Columns = tuple[
    list[str],
    list[str],
    list[str | None],
    list[int],
    list[float],
    list[int | None],
    list[str],
    list[str | None],
]


def _job_columns(jobs: Sequence[Job], now: float) -> _Columns:
    """The batch as the enqueue statement takes it, built column by column in one pass: a row
    object per job and a transpose afterwards cost more than the payload encoding itself."""
    ids: list[str] = []
    queues: list[str] = []
    tasks: list[str | None] = []
    priorities: list[int] = []
    run_ats: list[float] = []
    max_attempts: list[int | None] = []
    payloads: list[str] = []
    keys: list[str | None] = []
    for job in jobs:
        ids.append(job.id)
        queues.append(job.queue)
        tasks.append(job.task)
        priorities.append(job.priority)
        run_at = job.run_at
        run_ats.append(now if run_at is None else run_at)
        max_attempts.append(job.max_attempts)
        payloads.append(job.to_wire())
        keys.append(job.dedupe_key)
    return ids, queues, tasks, priorities, run_ats, max_attempts, payloads, keys


def _settle_row(outcome: Outcome) -> tuple[str, str | None, float | None, bool]:
    """(kind, text, time, charge_attempt) of one outcome, as the settle statement takes it."""
    if isinstance(outcome, Complete):
        if outcome.keep_until is None:
            return "ack", None, None, True
        return "keep", outcome.result, outcome.keep_until, True
    if isinstance(outcome, Retry):
        return "retry", outcome.error, outcome.run_at, outcome.charge_attempt
    if isinstance(outcome, DeadLetter):
        return "dead", outcome.error, None, True
    raise TypeError(f"not an Outcome: {outcome!r}")


def _alert(rec: Any) -> Alert:
    return Alert(
        key=rec["key"],
        kind=rec["kind"],
        queue=rec["queue"],
        task=rec["task"],
        job_id=rec["job_id"],
        detail=rec["detail"],
        count=rec["count"],
        first_at=rec["first_at"],
        last_at=rec["last_at"],
        next_at=rec["next_at"],
        attempts=rec["attempts"],
        last_error=rec["last_error"],
        sent_at=rec["sent_at"],
        token=rec["token"],
    )


def _slot_columns(slots: Sequence[tuple[str, str]]) -> tuple[list[str], list[str]]:
    return [key for key, _ in slots], [holder for _, holder in slots]


def _payload(rec: Any) -> str | bytes:
    text: str | None = rec["payload"]
    return bytes(rec["payload_raw"]) if text is None else text


def _delivery(rec: Any) -> Delivery:
    lease = Lease(rec["id"], rec["lease_token"], rec["queue"])
    return Delivery(lease, _payload(rec), rec["attempts"], rec["lease_until"])


def _info(rec: Any, now: float | None) -> JobInfo:
    state = JobState(rec["state"])
    if state is JobState.PENDING and now is not None and rec["run_at"] > now:
        state = JobState.SCHEDULED
    payload = _payload(rec)
    if isinstance(payload, bytes):
        payload = payload.decode("utf-8", "replace")
    return JobInfo(
        id=rec["id"],
        queue=rec["queue"],
        state=state,
        task=rec["task"] or peek_task(payload),
        attempts=rec["attempts"],
        payload=payload,
        max_attempts=rec["max_attempts"],
        priority=rec["priority"],
        run_at=rec["run_at"],
        enqueued_at=rec["enqueued_at"],
        finished_at=rec["finished_at"],
        last_error=rec["last_error"],
        result=rec["result"],
        dedupe_key=rec["dedupe_key"],
        started_at=rec["started_at"],
        progress=rec["progress"],
    )


def _one_line(text: str) -> str:
    """Driver messages may carry a DETAIL or HINT on further lines: keep log lines whole."""
    return " ".join(text.split())


def _first_wins(leases: Sequence[Lease], owned: set[tuple[str, str]]) -> list[bool]:
    """Per lease, whether the statement applied it; a lease repeated in one batch counts once."""
    seen: set[tuple[str, str]] = set()
    out = []
    for lease in leases:
        key = (lease.job_id, lease.token)
        out.append(key in owned and key not in seen)
        seen.add(key)
    return out


# -- the broker ----------------------------------------------------------------------------------


class PostgresBroker(Broker):
    """A broker on PostgreSQL 13+: one jobs table per schema, batch claims with SKIP LOCKED,
    LISTEN/NOTIFY wake-ups with polling as the fallback. See the module docstring for the URL."""

    def __init__(
        self, url: str, *, pool_size: int | None = None, poll_interval: float = 1.0
    ) -> None:
        super().__init__(url)
        self.options = parse_url(url)
        self._safe_url = redact_url(url)
        self._password = urlsplit(url).password
        self._pool_size = pool_size or self.options.pool_size
        self._poll_interval = poll_interval
        self._sql = _SQL(self.options.schema)
        self._pool: Any = None
        self._listener: Any = None
        self._listener_lock = asyncio.Lock()
        self._listen_retry_at = 0.0
        self._listen_failures = 0
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._next_prune = 0.0

    # -- plumbing ----------------------------------------------------------------------------

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"timeout": _CONNECT_TIMEOUT}
        if not self.options.prepared:
            kwargs["statement_cache_size"] = 0
        return kwargs

    def _scrub(self, text: str) -> str:
        return text.replace(self._password, "***") if self._password else text

    @asynccontextmanager
    async def _errors(self, action: str) -> AsyncIterator[None]:
        """Translate driver errors raised inside the block into taskkit errors (each a single
        line naming the server, never its password). After a connection failure the pool's
        connections are replaced on their next use: see ``_drop_connections``."""
        try:
            yield
        except TaskkitError:
            raise
        except _MISSING as exc:
            raise SchemaMissing(self._missing_message("is missing", f"({exc})")) from exc
        except _UNAVAILABLE as exc:
            if isinstance(exc, _BROKEN):
                await self._drop_connections()
            detail = str(exc) or type(exc).__name__
            if isinstance(exc, asyncpg.InternalClientError):
                detail = f"the connection broke during the call (asyncpg: {detail})"
            raise BrokerUnavailable(
                f"PostgreSQL at {self._safe_url} is unavailable ({action}): "
                f"{_one_line(self._scrub(detail))}"
            ) from exc
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise BrokerError(
                f"PostgreSQL error during {action} on {self._safe_url}: "
                f"{_one_line(self._scrub(str(exc)))}"
            ) from exc

    async def _drop_connections(self) -> None:
        """Have the pool replace every connection on its next use. A server restart kills them
        all, and asyncpg may hand one out before it has noticed (a connection that read the
        server's FATAL message while idle fails its next query with InternalClientError):
        replacing them all at the first failure makes the calls after the outage work at once.
        A connection in use is closed when it is released."""
        if self._pool is not None:
            await self._pool.expire_connections()

    def _missing_message(self, what: str, detail: str) -> str:
        return (
            f"taskkit schema {self.options.schema!r} {what} in {self._safe_url} {detail}: "
            f"run `taskkit migrate --broker {self._safe_url}`"
        )

    def _check_server(self, conn: Any) -> None:
        version = conn.get_server_version()
        if version.major < _MIN_SERVER:
            raise BrokerError(
                f"{self._safe_url} runs PostgreSQL {version.major}.{version.minor}; "
                f"taskkit needs {_MIN_SERVER} or newer"
            )

    async def _write(self, query: str, *args: Any) -> list[Any]:
        """Run a statement that moves leases (claim, extend, settle, release; the alert
        outbox's claims and slot heartbeats and releases too), shielded from cancellation and
        bounded by a timeout.

        Cancelling one mid-statement (a shutdown tearing down the worker's tasks) would leave it
        unknown whether it happened: a decided outcome could be lost, or jobs claimed for
        nobody. Letting the few milliseconds finish keeps the database and the caller in step.
        A server that does not answer within ``_WRITE_TIMEOUT`` raises BrokerUnavailable
        instead of hanging the shutdown.
        """
        with anyio.CancelScope(shield=True):
            recs: list[Any] = await self.pool.fetch(query, *args, timeout=_WRITE_TIMEOUT)
        return recs

    def query(self, name: str) -> str:
        """The named statement of postgres_queries.sql rendered for this broker's schema
        (for EXPLAIN and debugging)."""
        return self._sql.q[name]

    @property
    def pool(self) -> Any:
        """The asyncpg pool (for advanced use); BrokerError before ``connect()``. Connections
        go back to the pool without a session reset: leave no session state (SET, LISTEN) on
        them."""
        if self._pool is None:
            raise BrokerError(f"{self!r} is not connected: use `async with broker` or connect()")
        return self._pool

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the pool and check the schema is at the latest version (see Broker.connect)."""
        if self._pool is not None:
            return
        async with self._errors("connect"):
            # min_size=0: no connection floor for asyncpg to restore in the background, which
            # while the server is down logs a traceback per try; connections are (re)made when
            # a call needs one, and a failure reaches the caller as BrokerUnavailable.
            pool = await asyncpg.create_pool(
                self.options.dsn,
                min_size=0,
                max_size=self._pool_size,
                reset=_keep_session,
                **self._connect_kwargs(),
            )
            try:
                async with pool.acquire() as conn:
                    await self._check_schema(conn)
            except BaseException:
                await pool.close()
                raise
        self._pool = pool

    async def _check_schema(self, conn: Any) -> None:
        self._check_server(conn)
        if not await conn.fetchval(self._sql.q["has_version_table"]):
            raise SchemaMissing(self._missing_message("is missing", "(no schema_version table)"))
        applied = {r["version"] for r in await conn.fetch(self._sql.q["versions"])}
        missing = [v for v, _ in self._sql.migrations if v not in applied]
        if missing:
            raise SchemaMissing(
                self._missing_message("is out of date", f"(not applied: {', '.join(missing)})")
            )

    async def close(self) -> None:
        """Close the listener connection and the pool. Safe to call twice."""
        listener, self._listener = self._listener, None
        pool, self._pool = self._pool, None
        if listener is not None:
            listener.remove_termination_listener(self._on_listener_lost)
            async with self._errors("close"):
                await listener.close()
        if pool is not None:
            async with self._errors("close"):
                await pool.close()
        self._wake_all()

    async def migrate(self) -> list[str]:
        """Create or upgrade the schema; returns the versions applied (``[]`` when current).

        Runs in one transaction under ``pg_advisory_xact_lock``, so it is safe from several
        processes at once. Needs no ``connect()``: it uses a connection of its own.
        """
        async with self._errors("migrate"):
            conn = await asyncpg.connect(self.options.dsn, **self._connect_kwargs())
            try:
                return await self._migrate(conn)
            finally:
                await conn.close()

    async def _migrate(self, conn: Any) -> list[str]:
        self._check_server(conn)
        q = self._sql.q
        if await conn.fetchval(q["has_version_table"]):
            done = {r["version"] for r in await conn.fetch(q["versions"])}
            if all(v in done for v, _ in self._sql.migrations):
                return []
        applied: list[str] = []
        async with conn.transaction():
            await conn.execute(q["lock_migrations"], self.options.schema)
            await conn.execute(q["create_version_table"])
            done = {r["version"] for r in await conn.fetch(q["versions"])}
            for version, sql in self._sql.migrations:
                if version not in done:
                    await conn.execute(sql)
                    await conn.execute(q["record_version"], version)
                    applied.append(version)
        if applied:
            log.info("migrated %s to %s", self._safe_url, ", ".join(applied))
        return applied

    # -- producing ---------------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[Job], now: float) -> list[str]:
        """See Broker.enqueue: one INSERT ... ON CONFLICT DO NOTHING for the batch."""
        if not jobs:
            return []
        columns = _job_columns(jobs, now)
        async with self._errors("enqueue"):
            return await self._insert(self.pool, columns, now)

    async def enqueue_in(self, conn: Any, jobs: Sequence[Job], now: float) -> list[str]:
        """Enqueue with the caller's asyncpg connection, inside its transaction if one is open:
        the jobs become visible, and idle workers are woken, only when it commits. Same
        semantics and return value as ``enqueue``; needs no ``connect()``."""
        if not jobs:
            return []
        async with self._errors("enqueue"):
            return await self._insert(conn, _job_columns(jobs, now), now)

    async def enqueue_raw(self, queue: str, payload: bytes | str, now: float) -> str:
        """See Broker.enqueue_raw. A payload PostgreSQL text cannot hold (bytes that are not
        UTF-8, or a NUL character) is stored as bytes and delivered as bytes, so the worker can
        say what is wrong with it."""
        validate_queue_name(queue)
        text: str | None = None
        try:
            text = payload.decode("utf-8") if isinstance(payload, bytes) else payload
        except UnicodeDecodeError:
            pass
        job_id = new_job_id()
        async with self._errors("enqueue"):
            if text is None or "\x00" in text:
                raw = payload if isinstance(payload, bytes) else payload.encode("utf-8")
                await self.pool.execute(self._sql.q["enqueue_bytes"], job_id, queue, raw, now)
                return job_id
            row: _Columns = (
                [job_id],
                [queue],
                [peek_task(text)],
                [0],
                [now],
                [None],
                [text],
                [None],
            )
            [stored_id] = await self._insert(self.pool, row, now)
        return stored_id

    async def _insert(self, conn: Any, columns: _Columns, now: float) -> list[str]:
        """Run the enqueue statement; resolve skipped rows to the id that holds their place.
        ``conn`` is a connection or the pool (whose ``fetch`` acquires and releases one: the
        same round trip, without a context manager's overhead per call)."""
        ids: list[str] = list(columns[0])
        keys = columns[7]
        todo = list(range(len(ids)))
        batch: Sequence[list[Any]] = columns
        for _ in range(_RACE_RETRIES):
            if len(batch[0]) == 1:
                recs = await conn.fetch(self._sql.q["enqueue_one"], *(c[0] for c in batch), now)
            else:
                recs = await conn.fetch(self._sql.q["enqueue"], *batch, now)
            todo = _resolve(ids, keys, todo, recs)
            if not todo:
                return ids
            batch = [[column[i] for i in todo] for column in columns]
        # Each round found the key held at insert time and free at lookup time: a hot key.
        raise BrokerError(
            f"could not enqueue {len(todo)} job(s): their dedupe keys kept changing hands"
        )

    # -- consuming ---------------------------------------------------------------------------

    async def reserve(
        self, queues: Sequence[str], limit: int, lease_for: float, wait: float, now: float
    ) -> list[Delivery]:
        """See Broker.reserve. While waiting, the claim's ``now`` advances with the wall clock
        so that jobs enqueued during the wait (run_at = the producer's now) are due."""
        wanted = list(dict.fromkeys(queues))
        if not wanted or limit <= 0:
            await anyio.sleep(max(wait, 0))
            return []
        if wait <= 0:
            return await self._claim(wanted, limit, lease_for, now)
        start = time.monotonic()
        wake = asyncio.Event()
        self._subscribe(wanted, wake)  # before claiming, so no wake-up falls in between
        try:
            while True:
                await self._ensure_listener()
                wake.clear()
                elapsed = time.monotonic() - start
                got = await self._claim(wanted, limit, lease_for, now + elapsed)
                if got or elapsed >= wait:
                    return got
                # Without a listener, the poll is all there is; with one, it still picks up
                # scheduled jobs as they come due.
                with anyio.move_on_after(min(wait - elapsed, self._poll_interval)):
                    await wake.wait()
        finally:
            self._unsubscribe(wanted, wake)

    async def _claim(
        self, queues: list[str], limit: int, lease_for: float, now: float
    ) -> list[Delivery]:
        async with self._errors("reserve"):
            recs = await self._write(self._sql.q["claim"], queues, now, limit, lease_for)
        got = [_delivery(r) for r in recs]
        if got:
            try:
                await anyio.lowlevel.checkpoint()
            except anyio.get_cancelled_exc_class():
                # The caller was cancelled while the claim ran: hand the jobs straight back
                # rather than leave them leased to nobody (and charged) until the lease ends.
                with anyio.CancelScope(shield=True):
                    try:
                        await self.release([d.lease for d in got], now)
                    except BrokerError as exc:
                        log.warning("could not hand back %d claimed jobs: %s", len(got), exc)
                raise
        return got

    async def extend(self, leases: Sequence[Lease], lease_for: float, now: float) -> list[Lease]:
        """See Broker.extend: one UPDATE for the batch (a HOT update: lease_until is unindexed)."""
        if not leases:
            return []
        async with self._errors("extend"):
            recs = await self._write(
                self._sql.q["extend"],
                [ls.job_id for ls in leases],
                [ls.token for ls in leases],
                now + lease_for,
            )
        owned = {(r["id"], r["lease_token"]) for r in recs}
        return [ls for ls in leases if (ls.job_id, ls.token) not in owned]

    async def settle(self, items: Sequence[tuple[Lease, Outcome]], now: float) -> list[bool]:
        """See Broker.settle: one statement for the whole batch, whatever the mix of outcomes,
        dead letters' alerts included (so each alert commits with its dead letter, or neither
        does)."""
        if not items:
            return []
        leases = [lease for lease, _ in items]
        first = _first_wins(leases, {(ls.job_id, ls.token) for ls in leases})
        batch = [(ls, _settle_row(out)) for (ls, out), ok in zip(items, first, strict=True) if ok]
        async with self._errors("settle"):
            recs = await self._write(
                self._sql.q["settle"],
                [ls.job_id for ls, _ in batch],
                [ls.token for ls, _ in batch],
                [row[0] for _, row in batch],
                [row[1] for _, row in batch],
                [row[2] for _, row in batch],
                [row[3] for _, row in batch],
                now,
                ALERT_DETAIL_LIMIT,
                _ANNOUNCE_AHEAD,
            )
        return _first_wins(leases, {(r["id"], r["token"]) for r in recs})

    async def release(self, leases: Sequence[Lease], now: float) -> None:
        """See Broker.release: one UPDATE for the batch; wakes idle workers of those queues."""
        if not leases:
            return
        async with self._errors("release"):
            await self._write(
                self._sql.q["release"],
                [ls.job_id for ls in leases],
                [ls.token for ls in leases],
                now,
            )

    async def reclaim_expired(
        self, queues: Sequence[str], lease_for: float, limit: int, now: float
    ) -> list[Delivery]:
        """See Broker.reclaim_expired. Also prunes expired kept results and cancelled jobs now
        and then, since every worker calls this periodically."""
        if not queues or limit <= 0:
            return []
        await self._prune(now)
        async with self._errors("reclaim"):
            recs = await self.pool.fetch(
                self._sql.q["reclaim_expired"], list(queues), now, limit, lease_for
            )
        return [_delivery(r) for r in recs]

    async def _prune(self, now: float) -> None:
        """Delete a batch of expired kept results and cancelled jobs, and of delivered alerts,
        idle rate keys and abandoned slots over ``_PRUNE_IDLE_AFTER`` old, at most every
        ``_PRUNE_EVERY`` seconds: one statement."""
        if now < self._next_prune:
            return
        try:
            async with self._errors("prune"):
                gone = await self.pool.fetchval(
                    self._sql.q["prune"], now, _PRUNE_BATCH, _PRUNE_IDLE_AFTER
                )
        except BrokerError as exc:
            log.warning("pruning expired rows failed: %s", exc)
            return
        # A full batch of jobs means more are waiting: prune again on the next call. (The other
        # tables change slowly; a batch each pass keeps up with them.)
        self._next_prune = now if gone >= _PRUNE_BATCH else now + _PRUNE_EVERY

    # -- wake-ups ----------------------------------------------------------------------------

    def _subscribe(self, queues: list[str], event: asyncio.Event) -> None:
        for queue in queues:
            self._waiters.setdefault(queue, set()).add(event)

    def _unsubscribe(self, queues: list[str], event: asyncio.Event) -> None:
        for queue in queues:
            waiting = self._waiters.get(queue)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._waiters[queue]

    def _wake_all(self) -> None:
        for waiting in self._waiters.values():
            for event in waiting:
                event.set()

    def _wake_queue(self, queue: str) -> None:
        for event in self._waiters.get(queue, ()):
            event.set()

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        # "<queue>" means now; "<queue> <run_at>" (queue names hold no spaces) means at run_at,
        # by this host's wall clock (the core's clock is wall time too). A time that does not
        # parse wakes at once: a spurious claim is cheap, a missed one costs a poll interval.
        queue, _, due = payload.partition(" ")
        try:
            delay = float(due) - time.time() if due else 0.0
        except ValueError:
            delay = 0.0
        if delay <= 0:
            self._wake_queue(queue)
        else:
            # Bounded: a sender whose clock runs ahead must not park the wake-up for long.
            delay = min(delay, _ANNOUNCE_AHEAD) + _DUE_SLACK
            asyncio.get_running_loop().call_later(delay, self._wake_queue, queue)

    def _on_listener_lost(self, conn: Any) -> None:
        if self._listener is conn:
            self._listener = None
            # Notifications may have been missed: let every waiter claim again (and re-arm).
            self._wake_all()

    async def _ensure_listener(self) -> bool:
        """Make sure a connection LISTENs on this schema's channel; False means poll instead."""
        if not self.options.listen or self._pool is None:
            return False
        if self._listener is not None and not self._listener.is_closed():
            return True
        if time.monotonic() < self._listen_retry_at:
            return False
        async with self._listener_lock:
            if self._listener is None or self._listener.is_closed():
                self._listener = await self._open_listener()
        return self._listener is not None

    async def _open_listener(self) -> Any:
        conn: Any = None
        try:
            conn = await asyncpg.connect(self.options.dsn, **self._connect_kwargs())
            await conn.add_listener(self.options.channel, self._on_notify)
            conn.add_termination_listener(self._on_listener_lost)
        except (*_UNAVAILABLE, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if conn is not None:
                conn.terminate()
            self._listen_failures += 1
            pause = min(_LISTEN_RETRY, _LISTEN_RETRY_FIRST * 2 ** (self._listen_failures - 1))
            self._listen_retry_at = time.monotonic() + pause
            # One line per outage: the first failure says what is wrong, the retries are quiet.
            log.log(
                logging.WARNING if self._listen_failures == 1 else logging.DEBUG,
                "cannot LISTEN on %s (%s); polling meanwhile, retrying in %.2g s",
                self._safe_url,
                _one_line(self._scrub(str(exc) or type(exc).__name__)),
                pause,
            )
            return None
        if self._listen_failures:
            log.info(
                "LISTEN on %s re-armed after %d failed tries", self._safe_url, self._listen_failures
            )
            self._listen_failures = 0
        return conn

    # -- admin -------------------------------------------------------------------------------

    async def get_job(self, job_id: str, now: float) -> JobInfo | None:
        """See Broker.get_job; a kept result or a cancelled job past its expiry counts as
        gone, even before it is pruned."""
        async with self._errors("get_job"):
            rec = await self.pool.fetchrow(self._sql.q["get_job"], job_id, now)
        return None if rec is None else _info(rec, now)

    async def stats(self, now: float) -> dict[str, QueueStats]:
        """See Broker.stats: one aggregate over the jobs; kept results and cancelled jobs are
        not counted (their queue is listed, with zero counts, until they expire)."""
        async with self._errors("stats"):
            recs = await self.pool.fetch(self._sql.q["stats"], now)
        return {
            r["queue"]: QueueStats(
                ready=r["ready"],
                scheduled=r["scheduled"],
                running=r["running"],
                dead=r["dead"],
                paused=r["paused"],
                oldest_ready_at=r["oldest_ready_at"],
            )
            for r in recs
        }

    async def list_dead(self, queue: str | None, limit: int) -> list[JobInfo]:
        """See Broker.list_dead."""
        async with self._errors("list_dead"):
            recs = await self.pool.fetch(self._sql.q["list_dead"], queue, limit)
        return [_info(r, None) for r in recs]

    async def requeue_dead(
        self, ids: Sequence[str] | None, queue: str | None, now: float
    ) -> list[str]:
        """See Broker.requeue_dead. Returns ids in the order given (or in enqueue order)."""
        id_list = None if ids is None else list(ids)
        async with self._errors("requeue_dead"):
            for attempt in range(_RACE_RETRIES):
                try:
                    recs = await self.pool.fetch(self._sql.q["requeue_dead"], id_list, queue, now)
                    break
                except asyncpg.UniqueViolationError:
                    # A concurrent enqueue took a revived job's dedupe key: look again.
                    if attempt == _RACE_RETRIES - 1:
                        raise
        revived = [r["id"] for r in recs]
        if id_list is not None:
            order = {job_id: i for i, job_id in reversed(list(enumerate(id_list)))}
            revived.sort(key=order.__getitem__)
        return revived

    async def purge_dead(self, ids: Sequence[str] | None, queue: str | None) -> int:
        """See Broker.purge_dead."""
        async with self._errors("purge_dead"):
            gone = await self.pool.fetchval(
                self._sql.q["purge_dead"], None if ids is None else list(ids), queue
            )
        return int(gone)

    async def cancel(self, job_id: str, keep_until: float, now: float) -> JobState | None:
        """See Broker.cancel: one statement that locks the row, so a claim in flight is either
        before it (the job reports RUNNING) or after it (the job is cancelled, never claimed)."""
        async with self._errors("cancel"):
            rec = await self.pool.fetchrow(self._sql.q["cancel"], job_id, keep_until, now)
        if rec is None:
            return None
        state = JobState(rec["state"])
        expires_at: float | None = rec["expires_at"]
        if state in _EXPIRING and expires_at is not None and expires_at <= now:
            return None  # expired but not pruned yet: gone, as get_job says
        return state

    async def set_progress(self, lease: Lease, progress: str, now: float) -> bool:
        """See Broker.set_progress: fenced by (id, lease_token), like every write after a
        claim."""
        async with self._errors("set_progress"):
            applied = await self.pool.fetchval(
                self._sql.q["set_progress"], lease.job_id, lease.token, progress
            )
        return applied is not None

    async def set_paused(self, queue: str, paused: bool) -> None:
        """See Broker.set_paused; resuming wakes idle workers of the queue."""
        validate_queue_name(queue)
        async with self._errors("set_paused"):
            await self.pool.execute(self._sql.q["pause" if paused else "resume"], queue)

    # -- the alert outbox --------------------------------------------------------------------

    async def record_alert(self, event: AlertEvent, now: float) -> None:
        """See Broker.record_alert: one upsert on the key's row."""
        async with self._errors("record_alert"):
            await self.pool.execute(
                self._sql.q["record_alert"],
                event.key,
                event.kind,
                event.queue,
                event.task,
                event.job_id,
                event.detail[:ALERT_DETAIL_LIMIT],
                now,
            )

    async def claim_alerts(self, limit: int, lease_for: float, now: float) -> list[Alert]:
        """See Broker.claim_alerts: one statement; shielded like a job claim, so a caller
        cancelled mid-claim does not leave alerts leased to nobody."""
        if limit <= 0:
            return []
        async with self._errors("claim_alerts"):
            recs = await self._write(self._sql.q["claim_alerts"], now, limit, lease_for)
        return [_alert(r) for r in recs]

    async def finish_alert(
        self, alert: Alert, sent: bool, next_at: float, error: str | None, now: float
    ) -> bool:
        """See Broker.finish_alert: one UPDATE fenced by (key, token)."""
        if alert.token is None:
            return False
        async with self._errors("finish_alert"):
            recs = await self._write(
                self._sql.q["finish_alert"],
                alert.key,
                alert.token,
                sent,
                next_at,
                alert.count,
                error,
                now,
            )
        return bool(recs)

    async def list_alerts(self, pending_only: bool, limit: int) -> list[Alert]:
        """See Broker.list_alerts."""
        async with self._errors("list_alerts"):
            recs = await self.pool.fetch(self._sql.q["list_alerts"], pending_only, limit)
        return [_alert(r) for r in recs]

    # -- flow control ------------------------------------------------------------------------

    async def acquire_rate(self, key: str, interval: float, now: float) -> float:
        """See Broker.acquire_rate: one upsert, conditional on the next free time. A refusal
        whose snapshot missed the grant that caused it reads the next free time again."""
        async with self._errors("acquire_rate"):
            for _ in range(_RACE_RETRIES):
                rec = await self.pool.fetchrow(self._sql.q["acquire_rate"], key, interval, now)
                if rec["granted"]:
                    return 0.0
                free_at: float | None = rec["free_at"]
                if free_at is None or free_at <= now:
                    free_at = await self.pool.fetchval(self._sql.q["rate_free_at"], key)
                if free_at is not None and free_at > now:
                    return free_at - now
                # Between the two reads the row was pruned, or re-made by the grant of a caller
                # whose clock is behind: ask again.
        # Still unsettled: refuse, briefly. A refusal records nothing, so it is always safe.
        return _RATE_RETRY

    async def acquire_slot(self, key: str, holder: str, limit: int, ttl: float, now: float) -> bool:
        """See Broker.acquire_slot: one transaction that takes the key's advisory lock, then
        decides and writes in one statement (see lock_slot_key and acquire_slot in
        postgres_queries.sql). Shielded: a caller cancelled mid-call must not leave a slot held
        that it does not know about (it would block the key until ``ttl`` runs out)."""
        q = self._sql.q
        async with self._errors("acquire_slot"):
            with anyio.CancelScope(shield=True):
                async with self.pool.acquire() as conn, conn.transaction():
                    await conn.execute(q["lock_slot_key"], key, timeout=_WRITE_TIMEOUT)
                    held = await conn.fetchval(
                        q["acquire_slot"], key, holder, limit, ttl, now, timeout=_WRITE_TIMEOUT
                    )
        return bool(held)

    async def extend_slots(self, slots: Sequence[tuple[str, str]], ttl: float, now: float) -> None:
        """See Broker.extend_slots: one UPDATE for the batch."""
        if not slots:
            return
        keys, holders = _slot_columns(slots)
        async with self._errors("extend_slots"):
            await self._write(self._sql.q["extend_slots"], keys, holders, now + ttl)

    async def release_slots(self, slots: Sequence[tuple[str, str]]) -> None:
        """See Broker.release_slots: one DELETE for the batch, shielded so a shutdown that
        cancels the caller still gives the slots back."""
        if not slots:
            return
        keys, holders = _slot_columns(slots)
        async with self._errors("release_slots"):
            await self._write(self._sql.q["release_slots"], keys, holders)


async def _keep_session(conn: Any) -> None:
    """Pool connections are returned as they are: the broker never changes session state (no
    LISTEN, settings or session locks on them), so asyncpg's default reset query (UNLISTEN *;
    RESET ALL; ...) would only cost a round trip per call. An open transaction is still rolled
    back by asyncpg itself."""


def _resolve(
    ids: list[str], keys: Sequence[str | None], todo: list[int], recs: Sequence[Any]
) -> list[int]:
    """Fill ``ids`` from one enqueue round over the rows ``todo``; return the rows to retry.

    ``ids`` starts as the input ids; ``recs`` are the round's skipped rows (``pos`` 1-based in
    ``todo``; one row with a NULL pos when none was skipped). A skipped row takes the id of the
    active job holding its dedupe key; a holder stored earlier in the same batch is invisible to
    the statement, so it is matched here. A row skipped because its id exists (or repeats in the
    batch) is that job already: its id stands.
    """
    skipped = {rec["pos"] - 1: rec for rec in recs if rec["pos"] is not None}
    if not skipped:
        return []
    first_by_key: dict[str, str] = {}
    for n, i in enumerate(todo):
        key = keys[i]
        if key is not None and n not in skipped:
            first_by_key.setdefault(key, ids[i])
    retry: list[int] = []
    for n, rec in sorted(skipped.items()):
        i = todo[n]
        key = keys[i]
        if rec["holder"] is not None:
            ids[i] = rec["holder"]
        elif key is None or rec["id_taken"]:
            pass  # the input id stands
        elif key in first_by_key:
            ids[i] = first_by_key[key]
        else:
            retry.append(i)  # the holder committed after this statement's snapshot
    return retry
