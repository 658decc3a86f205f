"""RedisBroker: jobs in Redis (``redis://`` and ``rediss://``), through redis.asyncio.

URL: ``redis://[:password@]host[:port][/db][?prefix=NAME&...]``. Query options taskkit reads
(and strips before the URL reaches ``redis.asyncio.from_url``): ``prefix`` (key prefix, default
``taskkit``; same characters as a queue name), ``dead_max`` (dead letters kept per queue, default
10000, 0 = no limit), ``dead_ttl`` (seconds a dead letter is kept, default 7 days, 0 = forever),
``processing_grace`` (seconds, default 60; see "Crash between BLMOVE and the claim"). Keyword
arguments of the same names win over the URL; any other keyword goes to ``from_url``.

Key layout (P = prefix, Q = queue; ``{Q}`` is the hash tag, so all keys of a queue live in one
Redis Cluster slot and every Lua script works on one slot). Details in ``redis_scripts.lua``::

    P:queues                  set     queue registry (names seen by enqueue/reserve/pause)
    P:{Q}:ready               list    the inbox BLMOVE waits on: wake hints and foreign payloads
    P:{Q}:processing:<bid>    list    BLMOVE's destination, one per broker instance <bid>
    P:{Q}:workers             zset    broker instance -> last ``now`` it claimed on Q
    P:{Q}:queued              zset    due pending jobs, ordered priority, run_at, FIFO
    P:{Q}:scheduled           zset    pending jobs by run_at, not yet due
    P:{Q}:leases              zset    running jobs by lease_until
    P:{Q}:tokens              hash    id -> lease token (exactly the running jobs)
    P:{Q}:attempts            hash    id -> attempts
    P:{Q}:payloads            hash    id -> payload as stored
    P:{Q}:meta                hash    id -> JSON: state, priority, run_at, seq, times, dedupe key,
                                      max_attempts, last error
    P:{Q}:dead                zset    dead jobs by finished_at
    P:{Q}:dedupe              hash    dedupe key -> id of the active job holding it
    P:{Q}:seq                 string  FIFO counter
    P:{Q}:rawids              hash    payload -> ids promised by enqueue_raw
    P:{Q}:started             hash    id -> when its latest attempt was claimed
    P:{Q}:progress            hash    id -> progress JSON of its latest attempt
    P:{Q}:paused              string  present while Q is paused
    P:{Q}:done:<id>           hash    a finished job kept until keep_until (a kept result, or
                                      a cancelled job); real TTL (PEXPIRE)
    P:{Q}:alerts              hash    alert key -> JSON row of the alert outbox, for the keys
                                      whose events name Q (no TTL: one row per key)
    P:{Q}:alertdue            zset    pending alert keys (count > 0) by next_at
    P:{Q}:rawsince            string  when the inbox was first seen holding a raw payload
    P:rate:{K}                string  rate limit K: its next free time; PEXPIRE a little over
                                      the interval
    P:slots:{K}               zset    concurrency limit K: holder -> expiry; PEXPIRE a little
                                      over the longest ttl

``K`` is the caller's limit key verbatim, or, when it is empty or holds a brace (which would
cut the hash tag short), its SHA-1 in hex with ``:sha1`` after the tag.

Why per-queue hashes and not one hash per job: a claim pops ids it cannot know beforehand, and a
Lua script may only touch keys passed in KEYS (Cluster's rule). With the job's fields in a few
per-queue hashes, every script's keys are known up front. The one per-job key, ``done:<id>``, is
written by settle and cancel and read by get_job, which all know the id; it carries a real TTL so
kept results never outlive ``keep_until`` in memory. A job id maps to its queue by looking in every
queue of the registry (one pipelined round trip; ids enqueued through this instance are
remembered), so no cross-slot index has to be kept consistent.

Claim. ``reserve`` runs the ``claim`` script per queue, in the caller's order: it adopts what
this instance's BLMOVE moved, drains the inbox (dropping hints, adopting raw payloads), promotes
due scheduled jobs (workers promote; there is no scheduler process), then takes up to ``limit``
from ``queued`` with attempts + 1, a fresh token and a lease, all in one atomic step. When
nothing is due and ``wait > 0`` it blocks in ``BLMOVE P:{Q}:ready P:{Q}:processing:<bid> RIGHT
LEFT`` (several queues: one BLMOVE per queue, concurrently; the first to wake cancels the
others) for at most ``wait``, the time until the next scheduled job is due, and half the
processing grace, then claims again. Producers LPUSH and workers take from the right: FIFO, as
with ``redis-cli LPUSH``. The inbox holds wake hints rather than the jobs themselves because the
order of a claim (priority, then run time) is not the order of arrival: ``queued`` decides the
order, the list only wakes waiters (one hint per due job, at most 64 per call).

Foreign producers. ``redis-cli LPUSH P:{Q}:ready '{"task": "emails.send", "args": [...]}'``
enqueues a job: an inbox element that is not exactly 32 lowercase hex characters is a payload,
stored byte for byte under a fresh id and delivered (malformed ones too; the core dead-letters
them). ``enqueue_raw`` does that same LPUSH and also records the id it returns in ``rawids``, so
the adopting claim uses it. (A foreign payload of exactly 32 hex characters reads as a hint and is
dropped; ``enqueue_raw`` stores such a payload directly.) A payload waiting in the inbox has no
run time of its own: ``stats`` reports it as ready since ``rawsince``, set by ``enqueue_raw`` or
by the first ``stats`` call that sees such a payload, deleted by the claim that empties the inbox.
So a queue no worker serves still says how long its foreign jobs have waited.

Crash between BLMOVE and the claim. BLMOVE moves an element into this instance's processing
list; the next claim script adopts it. If the process dies in between, the element waits in
``processing:<bid>``: ``reclaim_expired`` (run by every worker's recovery loop) finds instances
not seen in ``workers`` for ``processing_grace`` seconds and adopts their lists. Recovering a live
instance's list by mistake only moves the element once, so it can never be delivered twice.

The alert outbox. A dead job's alert must be written in the same script as its dead letter, so
alert rows live with the queue the event names (``P:{Q}:alerts``); a dead job's alert key
(``dead:Q:task``) names its queue anyway. ``claim_alerts`` reads the due heads of every
registered queue's ``alertdue`` (one pipelined round trip), picks the earliest ``limit`` and
claims them per queue in one script each, which checks again that each is still due: a row
another caller claimed meanwhile is skipped, so a call may hand out fewer than it could have.
``list_alerts`` reads every queue's ``alerts`` hash. Rows are JSON objects of strings, like
``meta``, so times keep every digit the caller sent (cjson prints numbers with 14).

Flow control. Rate and slot keys are not tied to a queue: each key is its own hash tag, and each
acquire is one small script on that one key, atomic across every worker. They carry real TTLs
(wall clock) a little over the interval or slot ttl: the caller's clock decides grants, the TTL
only lets idle keys disappear.

Leases are fenced by token in every script (extend, settle, release); ``settle``, ``extend`` and
``release`` send one script call per queue for the whole batch (at most 500 jobs a call, so no
script holds the server for long), pipelined in one round trip; a claim leases its whole batch in
one call and returns it as one framed string. Dedupe keys are per queue (``P:{Q}:dedupe``).
Time always comes from the caller's ``now``; the only wall clock is the BLMOVE timeout, kept
under the client's ``socket_timeout`` when one is set.

Connection trouble. Unless the URL or a keyword says otherwise the client gets
``socket_timeout=5``, ``socket_connect_timeout=5`` and ``socket_keepalive=True``: every reply is
awaited at most 5 s, so a frozen server or a silently dropped connection cannot hang a worker,
and a longer wait is served by several BLMOVEs, each 1 s shorter than the timeout (half of it,
below 2 s). Every
connection, timeout and socket error (the pool's included) becomes ``BrokerUnavailable`` naming
the redacted URL, in one line; the worker logs it, backs off and calls again.

The script lane. Script calls and BLMOVE (the hot path: enqueue, claim, settle, extend) do not
go through ``execute_command`` or redis-py pipelines, whose pool checkout, locks, retry wrapper
and task per socket write cost about as much CPU as the rest of a single enqueue. The broker
keeps connections of its own, made by the client's pool (same host, credentials, TLS and
options), writes each call's commands packed in one go and reads the replies, all within
``socket_timeout``; a connection goes back to the lane only after every reply was read, and any
other end (timeout, cancellation, lost socket) closes it, so a reply can never be read as
another call's. One the server closed while it sat idle is reconnected before use, as the pool
does, so after a restart the next call simply reconnects; scripts the restarted server forgot
(NOSCRIPT) are loaded again and the call redone.
No command is retried inside the broker: a call whose reply was lost may have been applied, and
only the caller knows whether doing it twice is harmless (the worker's settle is fenced by token,
its claim is recovered when the lease runs out). ``health_check_interval`` stays off: with no
retries a failed PING fails the call just as the command would have. What a restart keeps is
what Redis persisted: with ``appendonly yes`` and ``appendfsync always`` nothing acknowledged is
lost; with ``everysec`` a crash of the machine (not of redis-server alone) may lose the last
second or two; without the AOF, everything since the last RDB snapshot (all of it when
``save ""``); tests/process/test_redis_restart.py restarts a real server both ways.

Scope: one Redis server (or a primary with replicas). The layout is ready for Redis Cluster
(every script and BLMOVE stays in one slot) but the client is ``redis.asyncio.Redis``, not
``RedisCluster``. Needs Redis 6.2 or newer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import redis.asyncio as aioredis
from redis import exceptions as rex
from redis.asyncio.connection import parse_url

from taskkit.broker import Broker, redact_url
from taskkit.errors import (
    BrokerError,
    BrokerUnavailable,
    BrokerURLError,
    ConfigurationError,
)
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
    new_job_id,
    peek_task,
    validate_queue_name,
)
from taskkit.outcome import Complete, DeadLetter, Outcome, Retry

__all__ = ["DEFAULT_PREFIX", "QueueKeys", "RedisBroker"]

DEFAULT_PREFIX: Final = "taskkit"
_OPTIONS: Final = ("prefix", "dead_max", "dead_ttl", "processing_grace")
_DEFAULT_DEAD_MAX: Final = 10_000
_DEFAULT_DEAD_TTL: Final = 7 * 24 * 3600.0
_DEFAULT_GRACE: Final = 60.0
_MIN_BLOCK: Final = 0.01  # BLMOVE's timeout 0 means "forever": never send it
_INBOX_MAX: Final = 256  # inbox elements a claim drains, beyond its limit
_PROMOTE_MAX: Final = 256  # due scheduled jobs a claim promotes, beyond its limit
_BATCH: Final = 500  # jobs per script call in enqueue/settle/...: bounds one script's run time
_STATS_SCAN: Final = 1000  # inbox elements stats inspects for foreign payloads
_RECENT_MAX: Final = 10_000  # ids remembered from enqueue for get_job
# Flow-control keys outlive what they must remember by this much, so a slow or skewed caller
# still finds them, and are never kept longer than _TTL_MAX (PEXPIRE wants an integer).
_FLOW_SLACK: Final = 1.0
_TTL_MAX: Final = 10 * 365 * 24 * 3600.0
_MIN_VERSION: Final = (6, 2)  # BLMOVE, RPOP with a count
# redis.asyncio options taskkit sets unless the URL or a keyword does (see "Connection trouble").
_CONNECTION_DEFAULTS: Final[dict[str, Any]] = {
    "socket_timeout": 5.0,
    "socket_connect_timeout": 5.0,
    "socket_keepalive": True,
}


# -- Lua -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Script:
    name: str
    text: str
    sha: str

    @property
    def bulk_sha(self) -> bytes:
        return b"$40\r\n%s\r\n" % self.sha.encode()


def _load_scripts() -> dict[str, _Script]:
    text = Path(__file__).with_name("redis_scripts.lua").read_text(encoding="utf-8")
    prelude, *parts = re.split(r"^--!script (\w+)[ \t]*$", text, flags=re.MULTILINE)
    scripts: dict[str, _Script] = {}
    for name, body in zip(parts[::2], parts[1::2], strict=True):
        full = f"{prelude}\n-- {name}\n{body}"
        scripts[name] = _Script(name, full, hashlib.sha1(full.encode()).hexdigest())
    return scripts


_SCRIPTS: Final = _load_scripts()
_ENQUEUE = _SCRIPTS["enqueue"]
_PUSH_RAW = _SCRIPTS["push_raw"]
_CLAIM = _SCRIPTS["claim"]
_RECLAIM = _SCRIPTS["reclaim"]
_RECOVER = _SCRIPTS["recover"]
_EXTEND = _SCRIPTS["extend"]
_SETTLE = _SCRIPTS["settle"]
_RELEASE = _SCRIPTS["release"]
_GET = _SCRIPTS["get"]
_LIST_DEAD = _SCRIPTS["list_dead"]
_REQUEUE = _SCRIPTS["requeue"]
_PURGE = _SCRIPTS["purge"]
_STATS = _SCRIPTS["stats"]
_CANCEL = _SCRIPTS["cancel"]
_PROGRESS = _SCRIPTS["progress"]
_ALERT_RECORD = _SCRIPTS["alert_record"]
_ALERT_CLAIM = _SCRIPTS["alert_claim"]
_ALERT_FINISH = _SCRIPTS["alert_finish"]
_RATE = _SCRIPTS["rate"]
_SLOT_ACQUIRE = _SCRIPTS["slot_acquire"]
_SLOT_EXTEND = _SCRIPTS["slot_extend"]

_WAKE: Final = "0" * 32
_NK: Final = 19  # queue keys every queue script takes first (KEYS[1..19] in redis_scripts.lua)

Arg = str | bytes | int | float
Call = tuple[_Script, Sequence[str], Sequence[Arg]]


# -- keys ------------------------------------------------------------------------------------


class QueueKeys:
    """The keys of one queue. Every one carries the hash tag ``{queue}``."""

    __slots__ = (
        "alertdue",
        "alerts",
        "attempts",
        "base",
        "dead",
        "dedupe",
        "fixed",
        "leases",
        "meta",
        "packed",
        "paused",
        "payloads",
        "progress",
        "queue",
        "queued",
        "rawids",
        "rawsince",
        "ready",
        "scheduled",
        "seq",
        "started",
        "tokens",
        "workers",
    )

    def __init__(self, prefix: str, queue: str) -> None:
        self.queue = queue
        self.base = f"{prefix}:{{{queue}}}"
        b = self.base
        self.paused, self.ready, self.workers = f"{b}:paused", f"{b}:ready", f"{b}:workers"
        self.queued, self.scheduled, self.leases = f"{b}:queued", f"{b}:scheduled", f"{b}:leases"
        self.tokens, self.attempts = f"{b}:tokens", f"{b}:attempts"
        self.payloads, self.meta, self.dead = f"{b}:payloads", f"{b}:meta", f"{b}:dead"
        self.dedupe, self.seq, self.rawids = f"{b}:dedupe", f"{b}:seq", f"{b}:rawids"
        self.started, self.progress = f"{b}:started", f"{b}:progress"
        self.alerts, self.alertdue = f"{b}:alerts", f"{b}:alertdue"
        self.rawsince = f"{b}:rawsince"
        # The order redis_scripts.lua expects as KEYS[1..19].
        self.fixed: tuple[str, ...] = (
            self.paused,
            self.ready,
            self.workers,
            self.queued,
            self.scheduled,
            self.leases,
            self.tokens,
            self.attempts,
            self.payloads,
            self.meta,
            self.dead,
            self.dedupe,
            self.seq,
            self.rawids,
            self.started,
            self.progress,
            self.alerts,
            self.alertdue,
            self.rawsince,
        )
        # The same keys as they go on the wire: every script call sends them, packed once.
        self.packed = b"".join(map(_bulk, self.fixed))

    def processing(self, broker_id: str) -> str:
        """The list BLMOVE moves into for one broker instance."""
        return f"{self.base}:processing:{broker_id}"

    def done(self, job_id: str) -> str:
        """A completed job kept for its result."""
        return f"{self.base}:done:{job_id}"


# -- errors ----------------------------------------------------------------------------------


class _Translate:
    """Turns redis-py exceptions into taskkit's, naming the (redacted) URL. ``on_unavailable``
    runs when the server could not be reached (to forget what a restart may have erased)."""

    __slots__ = ("_on_unavailable", "_url")

    def __init__(self, url: str, on_unavailable: Callable[[], None] | None = None) -> None:
        self._url = url
        self._on_unavailable = on_unavailable

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, rex.ConnectionError | rex.TimeoutError | OSError):
            # OSError: socket errors redis-py lets through (TimeoutError is one since 3.11).
            if self._on_unavailable is not None:
                self._on_unavailable()
            raise BrokerUnavailable(f"Redis at {self._url} is unavailable: {_line(exc)}") from exc
        if isinstance(exc, rex.RedisError):
            raise BrokerError(f"Redis at {self._url} failed: {_line(exc)}") from exc


async def _drop(conn: Any) -> None:
    """Close a lane connection whose state is unknown (it may still owe a reply)."""
    with anyio.CancelScope(shield=True):
        try:
            await conn.disconnect(nowait=True)
        except Exception:  # it is being thrown away: nothing to report
            pass


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# -- helpers ---------------------------------------------------------------------------------


def _command(*args: Arg) -> bytes:
    """A command in RESP, as _roundtrip sends it."""
    return b"*%d\r\n%s" % (len(args), b"".join(map(_bulk, args)))


def _bulk(value: Arg) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py's default encoder would (UTF-8,
    strict; numbers as str/repr)."""
    if isinstance(value, str):
        data = value.encode()
    elif isinstance(value, bytes):
        data = value
    elif isinstance(value, int):
        data = str(value).encode()
    else:
        data = repr(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


async def _cmd(client: aioredis.Redis, *args: Arg) -> Any:
    """One command. (redis-py leaves ``Redis.execute_command`` untyped.)"""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _payload(value: bytes) -> str | bytes:
    """Payloads are shown as text; bytes that are not UTF-8 stay bytes."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value


def _num(value: str | None) -> float | None:
    return None if value is None else float(value)


def _token() -> str:
    return os.urandom(12).hex()


def _chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _group(items: Iterable[tuple[int, str, Any]]) -> dict[str, list[tuple[int, Any]]]:
    groups: dict[str, list[tuple[int, Any]]] = {}
    for index, queue, item in items:
        groups.setdefault(queue, []).append((index, item))
    return groups


def _ttl_ms(seconds: float) -> int:
    """A flow-control key's TTL in milliseconds: ``seconds`` plus the slack, within bounds."""
    if not seconds < _TTL_MAX:  # also NaN
        seconds = _TTL_MAX
    return math.ceil((max(seconds, 0.0) + _FLOW_SLACK) * 1000)


def _scored(reply: Sequence[Any]) -> list[tuple[bytes, float]]:
    """A WITHSCORES reply as (member, score): redis-py pairs it up, a bare client would not."""
    if reply and not isinstance(reply[0], list | tuple):
        return [(reply[i], float(reply[i + 1])) for i in range(0, len(reply), 2)]
    return [(member, float(score)) for member, score in reply]


def _alert(queue: str, key: bytes, raw: bytes) -> Alert:
    """An outbox row as the scripts store it (see ``alerts`` in redis_scripts.lua)."""
    row: dict[str, str] = json.loads(raw.decode("utf-8", "replace"))
    return Alert(
        key=_text(key),
        kind=row["kd"],
        queue=queue,
        task=row.get("tk"),
        job_id=row.get("jb"),
        detail=row.get("dt", ""),
        count=int(row["c"]),
        first_at=float(row["fa"]),
        last_at=float(row["la"]),
        next_at=float(row["na"]),
        attempts=int(row["at"]),
        last_error=row.get("le"),
        sent_at=_num(row.get("sa")),
        token=row.get("tok"),
    )


def _option(value: Any, name: str, kind: type[int] | type[float], url: str) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError):
        raise BrokerURLError(
            f"invalid {name}={value!r} for Redis broker {redact_url(url)}: expected a number"
        ) from None
    if number < 0 or (isinstance(number, float) and not math.isfinite(number)):
        raise BrokerURLError(f"invalid {name}={value!r} for Redis broker {redact_url(url)}")
    return number


def _outcome_args(outcome: Outcome) -> tuple[str, ...]:
    """An outcome as the settle script's op and arguments (see redis_scripts.lua)."""
    if isinstance(outcome, Complete):
        if outcome.keep_until is None:
            return ("C",)
        if outcome.result is None:
            return ("K", repr(outcome.keep_until))
        return ("Kr", repr(outcome.keep_until), outcome.result)
    if isinstance(outcome, Retry):
        op = ("Re" if outcome.error is not None else "R") + ("c" if outcome.charge_attempt else "")
        if outcome.error is None:
            return (op, repr(outcome.run_at))
        return (op, repr(outcome.run_at), outcome.error)
    if isinstance(outcome, DeadLetter):
        detail = outcome.error[:ALERT_DETAIL_LIMIT]
        if detail == outcome.error:
            return ("D", outcome.error)
        # Cut here: Python counts characters, Lua would count bytes.
        return ("Dd", outcome.error, detail)
    raise TypeError(f"not an outcome: {outcome!r}")


# -- the broker ------------------------------------------------------------------------------


class RedisBroker(Broker):
    """Jobs in Redis; see the module docstring for the layout and the claim protocol.

    ``connection_factory`` builds the client at ``connect()`` instead of ``from_url`` (the
    broker owns and closes it), e.g. ``lambda: fakeredis.FakeAsyncRedis(server=server)``.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        connection_factory: Callable[[], aioredis.Redis] | None = None,
        prefix: str | None = None,
        dead_max: int | None = None,
        dead_ttl: float | None = None,
        processing_grace: float | None = None,
        **redis_options: Any,
    ) -> None:
        super().__init__(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise BrokerURLError(f"cannot parse Redis URL {redact_url(url)}: {exc}") from None
        if parts.scheme not in ("redis", "rediss"):
            raise BrokerURLError(
                f"not a Redis URL: {redact_url(url)!r} (use redis://host:port/db or rediss://)"
            )
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in _OPTIONS}
        rest = [(k, v) for k, v in query if k not in _OPTIONS]
        self._redis_url = urlunsplit(parts._replace(query=urlencode(rest)))
        if connection_factory is None:
            try:
                parse_url(self._redis_url)
            except ValueError as exc:
                raise BrokerURLError(f"invalid Redis URL {redact_url(url)}: {exc}") from None
        self.prefix = self._check_prefix(prefix if prefix is not None else ours.get("prefix"))
        self.dead_max: int = _option(
            dead_max if dead_max is not None else ours.get("dead_max", _DEFAULT_DEAD_MAX),
            "dead_max",
            int,
            url,
        )
        self.dead_ttl: float = _option(
            dead_ttl if dead_ttl is not None else ours.get("dead_ttl", _DEFAULT_DEAD_TTL),
            "dead_ttl",
            float,
            url,
        )
        grace = processing_grace if processing_grace is not None else ours.get("processing_grace")
        self.processing_grace: float = _option(
            grace if grace is not None else _DEFAULT_GRACE, "processing_grace", float, url
        )
        if self.processing_grace <= 0:
            raise BrokerURLError(f"processing_grace must be positive ({redact_url(url)})")
        self.broker_id = os.urandom(8).hex()
        """This instance's id in ``P:{Q}:workers`` and its processing lists."""
        self._factory = connection_factory
        self._redis_options = {**_CONNECTION_DEFAULTS, **redis_options, "decode_responses": False}
        self._client: aioredis.Redis | None = None
        self._errors = _Translate(redact_url(url), self._forget_registrations)
        self._registry = f"{self.prefix}:queues"
        self._keys: dict[str, QueueKeys] = {}
        self._fixed_at: dict[str, QueueKeys] = {}  # a queue's first key -> its keys (packing)
        # The script lane (see _roundtrip): connections of our own, idle ones and all of them.
        self._idle: list[Any] = []
        self._lane: set[Any] = set()
        self._reply_timeout: float | None = None
        self._registered: set[str] = set()
        self._claimed_on: set[str] = set()
        self._recent: OrderedDict[str, str] = OrderedDict()
        self._last_now = 0.0  # the caller's clock at the last claim, for close()
        self._block_max = math.inf

    def _forget_registrations(self) -> None:
        """After a lost connection: the server may have restarted empty, so register queues
        again on the next call that needs them."""
        self._registered.clear()

    def _check_prefix(self, prefix: str | None) -> str:
        if prefix is None:
            return DEFAULT_PREFIX
        try:
            return validate_queue_name(prefix)
        except ConfigurationError:
            raise BrokerURLError(
                f"invalid Redis key prefix {prefix!r} in {redact_url(self.url)}: use 1-128 "
                "characters from A-Z a-z 0-9 _ . : - starting with a letter or digit"
            ) from None

    def keys(self, queue: str) -> QueueKeys:
        """The Redis keys of ``queue`` (validated), e.g. ``keys("default").ready`` for LPUSH."""
        found = self._keys.get(queue)
        if found is None:
            found = self._keys[queue] = QueueKeys(self.prefix, validate_queue_name(queue))
            self._fixed_at[found.paused] = found
        return found

    @property
    def client(self) -> aioredis.Redis:
        """The connected redis.asyncio client."""
        if self._client is None:
            raise BrokerError(
                f"Redis broker {redact_url(self.url)} is not connected: "
                "call connect() or use `async with broker:`"
            )
        return self._client

    # -- lifecycle -----------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect, PING, check the server version and load the Lua scripts."""
        if self._client is not None:
            return
        if self._factory is not None:
            client = self._factory()
        else:
            client = aioredis.from_url(self._redis_url, **self._redis_options)
        try:
            await _cmd(client, "PING")
        except TypeError as exc:  # an option redis-py does not know, from the URL or a keyword
            await client.aclose()
            raise BrokerURLError(f"bad option for Redis at {redact_url(self.url)}: {exc}") from None
        except (rex.RedisError, OSError) as exc:
            await client.aclose()
            raise BrokerUnavailable(
                f"cannot reach Redis at {redact_url(self.url)}: {_line(exc)}"
            ) from exc
        try:
            await self._check_version(client)
            pipe = client.pipeline(transaction=False)
            for script in _SCRIPTS.values():
                pipe.execute_command("SCRIPT", "LOAD", script.text)
            with self._errors:
                await pipe.execute()
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        # A BLMOVE must return before the socket read times out.
        socket_timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
        self._block_max = math.inf
        self._reply_timeout = None
        if isinstance(socket_timeout, int | float) and socket_timeout > 0:
            self._block_max = max(socket_timeout * 0.5, socket_timeout - 1.0, _MIN_BLOCK)
            self._reply_timeout = float(socket_timeout)

    async def _check_version(self, client: aioredis.Redis) -> None:
        try:
            info = await _cmd(client, "INFO", "server")
        except rex.ResponseError:
            return  # a server without INFO (fakeredis): trust it
        except rex.RedisError as exc:
            with self._errors:
                raise exc
        version = str(info.get("redis_version", "")) if isinstance(info, dict) else ""
        numbers = tuple(int(p) for p in re.findall(r"\d+", version)[:2])
        if numbers and numbers < _MIN_VERSION:
            raise BrokerError(
                f"Redis at {redact_url(self.url)} runs {version}; taskkit needs 6.2 or newer "
                "(BLMOVE, RPOP with a count)"
            )

    async def close(self) -> None:
        """Hand back anything this instance's BLMOVE moved but did not claim, then disconnect."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            calls: list[Call] = [
                (
                    _RECOVER,
                    (*k.fixed, k.processing(self.broker_id)),
                    (repr(self._last_now), self.broker_id, "0", _token() + _token(), "1"),
                )
                for k in map(self.keys, sorted(self._claimed_on))
            ]
            if calls:
                await self._run(client, calls)
        except (rex.RedisError, OSError, BrokerError):
            pass  # the grace-period recovery of other workers covers it
        finally:
            self._claimed_on.clear()
            # A call still in flight puts its connection back in the old list, never used again.
            lane, self._lane, self._idle = self._lane, set(), []
            for conn in lane:
                await _drop(conn)
            await client.aclose()

    # -- script calls ----------------------------------------------------------------------------

    async def _eval(self, script: _Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        return (await self._run(self.client, [(script, keys, args)]))[0]

    async def _eval_many(self, calls: Sequence[Call]) -> list[Any]:
        """Run script calls pipelined in one round trip; results in order."""
        return await self._run(self.client, calls)

    async def _run(self, client: aioredis.Redis, calls: Sequence[Call]) -> list[Any]:
        return await self._run_packed(client, [(call[0], self._pack(*call)) for call in calls])

    async def _run_packed(
        self, client: aioredis.Redis, calls: Sequence[tuple[_Script, bytes]]
    ) -> list[Any]:
        """Script calls, already packed, in one round trip; results in order."""
        with self._errors:
            results = await self._roundtrip(client, [packed for _, packed in calls])
            missing = [i for i, r in enumerate(results) if isinstance(r, rex.NoScriptError)]
            if missing:  # the server lost its scripts (restart, SCRIPT FLUSH): load and redo
                load = {calls[i][0] for i in missing}
                again = await self._roundtrip(
                    client,
                    [
                        *(_command(b"SCRIPT", b"LOAD", script.text) for script in load),
                        *(calls[i][1] for i in missing),
                    ],
                )
                for i, result in zip(missing, again[len(load) :], strict=True):
                    results[i] = result
            for result in results:
                if isinstance(result, Exception):
                    raise result
            return results

    def _pack(self, script: _Script, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
        """``EVALSHA sha len(keys) *keys *args`` in RESP, the queue's fixed keys packed once."""
        fixed = self._fixed_at.get(keys[0]) if keys else None
        if fixed is not None and tuple(keys[:_NK]) == fixed.fixed:
            packed_keys = fixed.packed + b"".join(map(_bulk, keys[_NK:]))
        else:
            packed_keys = b"".join(map(_bulk, keys))
        return b"".join(
            (
                b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + len(keys) + len(args)),
                script.bulk_sha,
                _bulk(len(keys)),
                packed_keys,
                *map(_bulk, args),
            )
        )

    async def _roundtrip(self, client: aioredis.Redis, commands: Sequence[bytes]) -> list[Any]:
        """Send packed commands in one write and read their replies, in order; an error reply
        comes back in its place.

        Why not ``client.execute_command`` or a redis-py pipeline: those take a connection
        from the pool and give it back on every call, with locks, retry wrappers, a task per
        socket write (``wait_for``) and observability hooks: about 45 us of CPU per call, half
        a single enqueue. The lane keeps connections of its own, made by the client's pool (so
        with the same host, credentials, TLS and options) but never handed back to it, and
        times each round trip out as a whole after ``socket_timeout``. A connection is reused
        only after every reply was read; any other failure (timeout, cancellation, a lost
        socket) drops it, so a late reply can never be read as another call's.
        """
        idle = self._idle
        conn = idle.pop() if idle else self._new_connection(client)
        replies: list[Any] = []
        try:
            reader = getattr(conn, "_reader", None)
            if reader is not None and reader.at_eof():
                # The server closed it while idle (a restart): reconnect now, as the pool does
                # when it hands out a connection, rather than fail this call.
                await conn.disconnect(nowait=True)
            async with asyncio.timeout(self._reply_timeout):
                await conn.send_packed_command(
                    commands[0] if len(commands) == 1 else b"".join(commands), check_health=False
                )
                for _ in commands:
                    try:
                        replies.append(await conn.read_response())
                    except rex.ResponseError as exc:
                        replies.append(exc)
        except BaseException:
            self._lane.discard(conn)
            await _drop(conn)
            raise
        idle.append(conn)
        return replies

    def _new_connection(self, client: aioredis.Redis) -> Any:
        conn = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
        # _roundtrip times the whole call out instead: redis-py would start a task per write.
        conn.socket_timeout = None
        self._lane.add(conn)
        return conn

    async def _register(self, queues: Iterable[str]) -> None:
        new = [q for q in queues if q not in self._registered]
        if new:
            with self._errors:
                await _cmd(self.client, "SADD", self._registry, *new)
            self._registered.update(new)

    async def _all_queues(self) -> list[QueueKeys]:
        with self._errors:
            names = await _cmd(self.client, "SMEMBERS", self._registry)
        out = []
        for raw in sorted(_text(n) for n in names):
            try:
                out.append(self.keys(raw))
            except ConfigurationError:
                continue  # not written by taskkit; ignore
        return out

    def _remember(self, job_id: str, queue: str) -> None:
        self._recent[job_id] = queue
        if len(self._recent) > _RECENT_MAX:
            # popitem, not del of next(iter()): a dict skips every deleted slot before its first
            # live one, so trimming a plain dict from the front grows slower with each call.
            self._recent.popitem(last=False)

    @staticmethod
    def _deliveries(queue: str, blob: bytes, lease_until: float) -> list[Delivery]:
        """Parse lease_out's frames: ``<#id> <#payload> <attempts> <token>\\n<id><payload>``."""
        out = []
        pos, end = 0, len(blob)
        while pos < end:
            eol = blob.index(b"\n", pos)
            id_len, payload_len, attempts, token = blob[pos:eol].split(b" ")
            start = eol + 1 + int(id_len)
            pos = start + int(payload_len)
            lease = Lease(blob[eol + 1 : start].decode(), token.decode(), queue)
            out.append(Delivery(lease, blob[start:pos], int(attempts), lease_until))
        return out

    # -- producing -----------------------------------------------------------------------------

    async def enqueue(self, jobs: Sequence[Job], now: float) -> list[str]:
        """Store jobs (one atomic script per queue and batch); see ``Broker.enqueue``."""
        if not jobs:
            return []
        if len(jobs) == 1:  # the common single enqueue: no grouping
            groups = {jobs[0].queue: [(0, jobs[0])]}
        else:
            groups = _group((i, job.queue, job) for i, job in enumerate(jobs))
        await self._register(groups)
        calls: list[tuple[_Script, bytes]] = []
        slots: list[list[int]] = []
        for queue, members in groups.items():
            k = self.keys(queue)
            for chunk in _chunks(members, _BATCH):
                calls.append((_ENQUEUE, self._pack_enqueue(k, [job for _, job in chunk], now)))
                slots.append([i for i, _ in chunk])
        ids: list[str] = [""] * len(jobs)
        for positions, result in zip(
            slots, await self._run_packed(self.client, calls), strict=True
        ):
            for i, raw in zip(positions, result, strict=True):
                ids[i] = raw.decode()
                self._remember(ids[i], jobs[i].queue)
        return ids

    @staticmethod
    def _pack_enqueue(k: QueueKeys, jobs: Sequence[Job], now: float) -> bytes:
        """The enqueue script's EVALSHA in RESP (keys and arguments as redis_scripts.lua says),
        one format per job: packing is most of the broker's own CPU time per job."""
        done = []
        args = [_bulk(repr(now))]
        for job in jobs:
            key = f"{k.base}:done:{job.id}".encode()
            done.append(b"$%d\r\n%s\r\n" % (len(key), key))
            job_id = job.id.encode()
            wire = job.to_wire().encode()
            pr = b"%d" % job.priority
            ra = b"" if job.run_at is None else repr(job.run_at).encode()
            dk = job.dedupe_key.encode() if job.dedupe_key else b""
            ma = b"" if job.max_attempts is None else b"%d" % job.max_attempts
            args.append(
                b"$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                % (
                    len(job_id),
                    job_id,
                    len(wire),
                    wire,
                    len(pr),
                    pr,
                    len(ra),
                    ra,
                    len(dk),
                    dk,
                    len(ma),
                    ma,
                )
            )
        n_keys = _NK + len(jobs)
        return b"".join(
            (
                b"*%d\r\n$7\r\nEVALSHA\r\n" % (3 + n_keys + 1 + 6 * len(jobs)),
                _ENQUEUE.bulk_sha,
                _bulk(n_keys),
                k.packed,
                *done,
                *args,
            )
        )

    async def enqueue_raw(self, queue: str, payload: bytes | str, now: float) -> str:
        """LPUSH ``payload`` onto the queue's ready list, exactly as ``redis-cli LPUSH`` would,
        and promise the returned id to the claim that adopts it."""
        keys = self.keys(queue or DEFAULT_QUEUE)
        await self._register([keys.queue])
        job_id = new_job_id()
        await self._eval(_PUSH_RAW, keys.fixed, (repr(now), payload, job_id))
        self._remember(job_id, keys.queue)
        return job_id

    # -- consuming -----------------------------------------------------------------------------

    async def reserve(
        self, queues: Sequence[str], limit: int, lease_for: float, wait: float, now: float
    ) -> list[Delivery]:
        """Claim up to ``limit`` jobs; when none is due, block in BLMOVE up to ``wait`` seconds."""
        keys = [self.keys(q) for q in queues]
        if limit <= 0 or not keys:
            return []
        await self._register(k.queue for k in keys)
        started = time.monotonic()
        at = now
        while True:
            got, next_due = await self._claim(keys, limit, lease_for, at)
            if got:
                return got
            elapsed = time.monotonic() - started
            left = wait - elapsed
            if left <= 0:
                return []
            timeout = min(left, self.processing_grace / 2, self._block_max)
            if next_due is not None:
                timeout = min(timeout, next_due - at)
            await self._block(keys, max(timeout, _MIN_BLOCK))
            await anyio.lowlevel.checkpoint()  # fakeredis answers without yielding
            at = now + (time.monotonic() - started)

    async def _claim(
        self, keys: Sequence[QueueKeys], limit: int, lease_for: float, now: float
    ) -> tuple[list[Delivery], float | None]:
        out: list[Delivery] = []
        next_due: float | None = None
        lease_until = now + lease_for
        self._last_now = now
        for k in keys:
            self._claimed_on.add(k.queue)
            while (want := min(limit - len(out), _BATCH)) > 0:
                res = await self._eval(
                    _CLAIM,
                    (*k.fixed, k.processing(self.broker_id)),
                    (
                        repr(now),
                        want,
                        repr(lease_until),
                        _token(),
                        _token() + _token(),
                        self.broker_id,
                        _INBOX_MAX + want,
                        _PROMOTE_MAX + want,
                    ),
                )
                if not res[0] and res[1]:
                    due = float(res[1])
                    next_due = due if next_due is None else min(next_due, due)
                got = self._deliveries(k.queue, res[2], lease_until)
                out += got
                if len(got) < want:
                    break
            if len(out) >= limit:
                break
        return out, next_due

    async def _block(self, keys: Sequence[QueueKeys], timeout: float) -> None:
        """Wait in BLMOVE on every queue's ready list until one moves an element or time is up."""
        if len(keys) == 1:
            with self._errors:
                await self._blmove(keys[0], timeout)
            return
        failures: list[rex.RedisError | OSError] = []
        async with anyio.create_task_group() as tg:

            async def wait_on(k: QueueKeys) -> None:
                try:
                    moved = await self._blmove(k, timeout)
                except (rex.RedisError, OSError) as exc:
                    failures.append(exc)
                    moved = True
                if moved is not None:
                    # A cancelled BLMOVE may still have moved an element: the next claim
                    # adopts whatever sits in this instance's processing lists.
                    tg.cancel_scope.cancel()

            for k in keys:
                tg.start_soon(wait_on, k)
        if failures:
            with self._errors:
                raise failures[0]

    async def _blmove(self, k: QueueKeys, timeout: float) -> Any:
        processing = k.processing(self.broker_id)
        # On the lane too: a wake is on the pickup latency path (a cancelled wait drops its
        # connection there, as redis-py's read_response does).
        command = _command("BLMOVE", k.ready, processing, "RIGHT", "LEFT", timeout)
        [moved] = await self._roundtrip(self.client, [command])
        if isinstance(moved, Exception):
            raise moved
        return moved

    async def extend(self, leases: Sequence[Lease], lease_for: float, now: float) -> list[Lease]:
        """Push each owned lease to ``now + lease_for``; returns the lost ones."""
        if not leases:
            return []
        until = repr(now + lease_for)
        groups = _group((i, lease.queue, lease) for i, lease in enumerate(leases))
        calls: list[Call] = []
        slots: list[list[int]] = []
        for queue, members in groups.items():
            keys = self.keys(queue).fixed
            for chunk in _chunks(members, _BATCH):
                args: list[Arg] = [until]
                for _, lease in chunk:
                    args += (lease.job_id, lease.token)
                calls.append((_EXTEND, keys, args))
                slots.append([i for i, _ in chunk])
        lost: list[int] = []
        for positions, result in zip(slots, await self._eval_many(calls), strict=True):
            lost += (positions[int(p) - 1] for p in result)
        return [leases[i] for i in sorted(lost)]

    async def settle(self, items: Sequence[tuple[Lease, Outcome]], now: float) -> list[bool]:
        """Apply outcomes; one script call per queue, all pipelined in one round trip."""
        if not items:
            return []
        groups = _group((i, item[0].queue, item) for i, item in enumerate(items))
        # claim_alerts finds a dead job's alert through the registry.
        await self._register(
            {lease.queue for lease, outcome in items if isinstance(outcome, DeadLetter)}
        )
        calls: list[Call] = []
        slots: list[list[int]] = []
        for queue, members in groups.items():
            k = self.keys(queue)
            for chunk in _chunks(members, _BATCH):
                keys = list(k.fixed)
                args: list[Arg] = [repr(now), self.dead_max, repr(self.dead_ttl), k.queue]
                for _, (lease, outcome) in chunk:
                    if isinstance(outcome, Complete) and outcome.keep_until is not None:
                        keys.append(k.done(lease.job_id))
                    args += (lease.job_id, lease.token, *_outcome_args(outcome))
                calls.append((_SETTLE, keys, args))
                slots.append([i for i, _ in chunk])
        applied = [False] * len(items)
        for positions, result in zip(slots, await self._eval_many(calls), strict=True):
            for i, ok in zip(positions, result, strict=True):
                applied[i] = ok == 49  # b"1"[0]
        return applied

    async def release(self, leases: Sequence[Lease], now: float) -> None:
        """Hand owned jobs back, runnable now, their attempt given back."""
        if not leases:
            return
        calls: list[Call] = []
        groups = _group((i, lease.queue, lease) for i, lease in enumerate(leases))
        for queue, members in groups.items():
            keys = self.keys(queue).fixed
            for chunk in _chunks(members, _BATCH):
                args: list[Arg] = [repr(now)]
                for _, lease in chunk:
                    args += (lease.job_id, lease.token)
                calls.append((_RELEASE, keys, args))
        await self._eval_many(calls)

    async def reclaim_expired(
        self, queues: Sequence[str], lease_for: float, limit: int, now: float
    ) -> list[Delivery]:
        """Re-lease expired jobs of any worker (attempts unchanged), and adopt what dead broker
        instances left in their processing lists (see the module docstring)."""
        out: list[Delivery] = []
        lease_until = now + lease_for
        threshold = repr(now - self.processing_grace)
        for k in map(self.keys, queues):
            while True:
                want = min(max(limit - len(out), 0), _BATCH)
                res = await self._eval(
                    _RECLAIM,
                    k.fixed,
                    (repr(now), repr(lease_until), want, _token(), threshold, self.broker_id),
                )
                stale = [w.decode() for w in res[1 : 1 + int(res[0])]]
                got = []
                if len(res) > 1 + len(stale):
                    got = self._deliveries(k.queue, res[-1], lease_until)
                    out += got
                if stale:
                    await self._recover(k, stale, now, threshold)
                if len(got) < want or want == 0:
                    break
        return out

    async def _recover(
        self, k: QueueKeys, broker_ids: Sequence[str], now: float, threshold: str
    ) -> None:
        """Adopt what stale broker instances left in their processing lists."""
        await self._eval_many(
            [
                (
                    _RECOVER,
                    (*k.fixed, k.processing(w)),
                    (repr(now), w, threshold, _token() + _token(), "0"),
                )
                for w in broker_ids
            ]
        )

    # -- admin ---------------------------------------------------------------------------------

    async def get_job(self, job_id: str, now: float) -> JobInfo | None:
        """The job, looked up in its queue (remembered from enqueue) or in every known queue."""
        known = self._recent.get(job_id)
        candidates = [self.keys(known)] if known else await self._all_queues()
        if not candidates:
            return None
        results = await self._eval_many(
            [(_GET, (*k.fixed, k.done(job_id)), (job_id,)) for k in candidates]
        )
        for k, res in zip(candidates, results, strict=True):
            if res[0] == 1:
                state = JobState.RUNNING if res[4] else None
                return self._info(job_id, k.queue, res[1:4], res[5:7], now, state)
            if res[0] == 2:
                if float(res[4]) <= now:
                    return None  # its time is up (the key's TTL follows shortly)
                info = self._info(job_id, k.queue, res[1:4], res[6:8], now)
                info.result = None if res[5] is None else res[5].decode()
                return info
        return None

    @staticmethod
    def _info(
        job_id: str,
        queue: str,
        stored: Sequence[Any],
        extra: Sequence[Any],
        now: float,
        state: JobState | None = None,
    ) -> JobInfo:
        """A JobInfo from (meta JSON, payload, attempts) and (started_at, progress)."""
        meta_raw, payload, attempts = stored
        started, progress = extra
        m: dict[str, str] = json.loads(meta_raw)
        run_at = float(m["ra"])
        if state is None:
            st = m.get("st", "pending")
            if st in ("dead", "done", "cancelled"):
                state = JobState(st)
            else:
                state = JobState.SCHEDULED if run_at > now else JobState.PENDING
        body = _payload(payload or b"")
        return JobInfo(
            id=job_id,
            queue=queue,
            state=state,
            task=peek_task(body),
            attempts=int(attempts),
            payload=body,
            max_attempts=int(m["ma"]) if "ma" in m else None,
            priority=int(m.get("pr", "0")),
            run_at=run_at,
            enqueued_at=_num(m.get("ea")),
            finished_at=_num(m.get("fa")),
            last_error=m.get("le"),
            dedupe_key=m.get("dk"),
            started_at=float(started) if started else None,
            progress=progress.decode() if progress else None,
        )

    async def stats(self, now: float) -> dict[str, QueueStats]:
        """Counts per registered queue (one pipelined round trip after reading the registry)."""
        queues = await self._all_queues()
        if not queues:
            return {}
        calls: list[Call] = [(_STATS, k.fixed, (repr(now), _STATS_SCAN)) for k in queues]
        return {
            k.queue: QueueStats(
                ready=r[0],
                scheduled=r[1],
                running=r[2],
                dead=r[3],
                paused=bool(r[4]),
                oldest_ready_at=float(r[5]) if r[5] else None,
            )
            for k, r in zip(queues, await self._eval_many(calls), strict=True)
        }

    async def _targets(self, queue: str | None) -> list[QueueKeys]:
        return [self.keys(queue)] if queue is not None else await self._all_queues()

    async def list_dead(self, queue: str | None, limit: int) -> list[JobInfo]:
        """Dead jobs, newest first."""
        targets = await self._targets(queue)
        if limit <= 0 or not targets:
            return []
        results = await self._eval_many([(_LIST_DEAD, k.fixed, (limit,)) for k in targets])
        found: list[tuple[float, JobInfo]] = []
        for k, res in zip(targets, results, strict=True):
            for i in range(0, len(res), 7):
                info = self._info(
                    res[i].decode(), k.queue, res[i + 2 : i + 5], res[i + 5 : i + 7], 0.0
                )
                found.append((float(res[i + 1]), info))
        found.sort(key=lambda pair: -pair[0])
        return [info for _, info in found[:limit]]

    async def _dead_ids(self, k: QueueKeys, ids: Sequence[str] | None) -> list[str]:
        if ids is not None:
            return list(ids)
        with self._errors:
            raw = await _cmd(self.client, "ZRANGE", k.dead, 0, -1)
        return [r.decode() for r in raw]

    async def requeue_dead(
        self, ids: Sequence[str] | None, queue: str | None, now: float
    ) -> list[str]:
        """Dead jobs back to pending, runnable now, attempts 0; returns the ids requeued."""
        out: list[str] = []
        for k in await self._targets(queue):
            for chunk in _chunks(await self._dead_ids(k, ids), _BATCH):
                if chunk:
                    res = await self._eval(_REQUEUE, k.fixed, (repr(now), *chunk))
                    out += (r.decode() for r in res)
        return out

    async def purge_dead(self, ids: Sequence[str] | None, queue: str | None) -> int:
        """Delete dead jobs; returns how many."""
        count = 0
        for k in await self._targets(queue):
            for chunk in _chunks(await self._dead_ids(k, ids), _BATCH):
                if chunk:
                    count += int(await self._eval(_PURGE, k.fixed, tuple(chunk)))
        return count

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Set or clear the queue's paused flag; resuming wakes waiting workers."""
        k = self.keys(queue)
        await self._register([k.queue])
        with self._errors:
            pipe = self.client.pipeline(transaction=True)
            if paused:
                pipe.execute_command("SET", k.paused, "1")
            else:
                pipe.execute_command("DEL", k.paused)
                pipe.execute_command("LPUSH", k.ready, _WAKE)
            await pipe.execute()

    async def cancel(self, job_id: str, keep_until: float, now: float) -> JobState | None:
        """Cancel a pending or scheduled job (kept, cancelled, until ``keep_until``); a running,
        done or dead job is left alone. Returns the state after the call, None if unknown."""
        known = self._recent.get(job_id)
        candidates = [self.keys(known)] if known else await self._all_queues()
        if not candidates:
            return None
        args = (job_id, repr(keep_until), repr(now))
        results = await self._eval_many(
            [(_CANCEL, (*k.fixed, k.done(job_id)), args) for k in candidates]
        )
        for state in results:
            if state is not None:
                return JobState(state.decode())
        return None

    async def set_progress(self, lease: Lease, progress: str, now: float) -> bool:
        """Store ``progress`` on the running job while ``lease`` owns it; False when lost."""
        k = self.keys(lease.queue)
        return bool(await self._eval(_PROGRESS, k.fixed, (lease.job_id, lease.token, progress)))

    # -- the alert outbox ----------------------------------------------------------------------

    async def record_alert(self, event: AlertEvent, now: float) -> None:
        """Merge ``event`` into its key's row, kept with ``event.queue`` (see the module
        docstring)."""
        k = self.keys(event.queue)
        await self._register([k.queue])
        args = (
            repr(now),
            event.key,
            event.kind,
            event.task or "",
            event.job_id or "",
            event.detail[:ALERT_DETAIL_LIMIT],
        )
        await self._eval(_ALERT_RECORD, k.fixed, args)

    async def claim_alerts(self, limit: int, lease_for: float, now: float) -> list[Alert]:
        """Claim the earliest due alerts of every queue: pick from the due heads of each queue's
        ``alertdue``, then claim per queue (a script that checks each is still due)."""
        queues = await self._all_queues()
        if limit <= 0 or not queues:
            return []
        heads = await self._commands(
            [
                ("ZRANGEBYSCORE", k.alertdue, "-inf", repr(now), "WITHSCORES", "LIMIT", 0, limit)
                for k in queues
            ]
        )
        due: list[tuple[float, str, bytes]] = []
        for k, reply in zip(queues, heads, strict=True):
            due += ((score, k.queue, key) for key, score in _scored(reply))
        due.sort()
        picked = due[:limit]
        if not picked:
            return []
        groups = _group((i, queue, key) for i, (_, queue, key) in enumerate(picked))
        next_at = repr(now + lease_for)
        calls: list[Call] = [
            (
                _ALERT_CLAIM,
                self.keys(queue).fixed,
                (repr(now), next_at, _token(), *(key for _, key in members)),
            )
            for queue, members in groups.items()
        ]
        claimed: dict[tuple[str, bytes], Alert] = {}
        for queue, flat in zip(groups, await self._eval_many(calls), strict=True):
            for i in range(0, len(flat), 2):
                claimed[queue, flat[i]] = _alert(queue, flat[i], flat[i + 1])
        return [a for _, queue, key in picked if (a := claimed.get((queue, key))) is not None]

    async def finish_alert(
        self, alert: Alert, sent: bool, next_at: float, error: str | None, now: float
    ) -> bool:
        """Record one delivery attempt while ``alert.token`` still holds the row."""
        if alert.token is None:
            return False
        op: tuple[str, ...] = ("S",) if sent else ("F",) if error is None else ("Fe", error)
        args: list[Arg] = [alert.key, alert.token, alert.count, repr(next_at), repr(now), *op]
        return bool(await self._eval(_ALERT_FINISH, self.keys(alert.queue).fixed, args))

    async def list_alerts(self, pending_only: bool, limit: int) -> list[Alert]:
        """Every queue's rows (one pipelined round trip), oldest first_at first."""
        queues = await self._all_queues()
        if limit <= 0 or not queues:
            return []
        found: list[Alert] = []
        for k, flat in zip(
            queues, await self._commands([("HGETALL", k.alerts) for k in queues]), strict=True
        ):
            found += (_alert(k.queue, key, raw) for key, raw in flat.items())
        if pending_only:
            found = [a for a in found if a.count > 0]
        found.sort(key=lambda a: a.first_at)
        return found[:limit]

    async def _commands(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """Plain commands, pipelined in one round trip; results in order."""
        with self._errors:
            pipe = self.client.pipeline(transaction=False)
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute())

    # -- flow control --------------------------------------------------------------------------

    def flow_key(self, kind: str, key: str) -> str:
        """The Redis key of the rate (``kind="rate"``) or slot (``"slots"``) limit ``key``."""
        if key and "{" not in key and "}" not in key:
            return f"{self.prefix}:{kind}:{{{key}}}"
        digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.prefix}:{kind}:{{{digest}}}:sha1"

    async def acquire_rate(self, key: str, interval: float, now: float) -> float:
        """One grant per ``interval`` seconds per ``key`` across every caller; returns 0.0 when
        granted, else the seconds until the next free time."""
        args = (repr(now), repr(now + interval), _ttl_ms(interval))
        free_at = await self._eval(_RATE, (self.flow_key("rate", key),), args)
        return 0.0 if free_at is None else max(float(free_at) - now, 0.0)

    async def acquire_slot(self, key: str, holder: str, limit: int, ttl: float, now: float) -> bool:
        """Hold one of ``limit`` slots of ``key`` until ``now + ttl``; False when all are held."""
        args = (repr(now), holder, limit, repr(now + ttl), _ttl_ms(ttl))
        return bool(await self._eval(_SLOT_ACQUIRE, (self.flow_key("slots", key),), args))

    async def extend_slots(self, slots: Sequence[tuple[str, str]], ttl: float, now: float) -> None:
        """Push each held slot's expiry to ``now + ttl``; one call per slot, pipelined."""
        until, ms = repr(now + ttl), _ttl_ms(ttl)
        calls: list[Call] = [
            (_SLOT_EXTEND, (self.flow_key("slots", key),), (holder, until, ms))
            for key, holder in slots
        ]
        if calls:
            await self._eval_many(calls)

    async def release_slots(self, slots: Sequence[tuple[str, str]]) -> None:
        """Give back each slot (a plain ZREM: one key, nothing to keep atomic with it)."""
        if slots:
            await self._commands([("ZREM", self.flow_key("slots", k), h) for k, h in slots])
