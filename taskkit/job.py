"""The job envelope, its JSON wire format, and the records brokers hand back.

A job travels as one JSON object (never pickle), version ``v`` 1, described by
``taskkit/job.schema.json``. The smallest valid job is what a foreign producer writes::

    {"task": "emails.send", "args": ["a@example.com"], "kwargs": {}}

Everything else has a default that the broker or the worker fills: a fresh id, the ``default``
queue, priority 0, run now, the task's own max_attempts/timeout. Counters that change while a job
lives (attempts, state, lease, last error, result) belong to the broker, not to the envelope.

Times are seconds since the epoch (floats), taken from the core's clock.
"""

from __future__ import annotations

import enum
import json
import os
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from taskkit.errors import ConfigurationError, PayloadInvalid

DEFAULT_QUEUE = "default"
# A job carries arguments, not data: big blobs belong in storage, passed by reference.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024

# Queue names end up in Redis keys, SQL values and log lines: keep them boring.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# Task names: printable, no whitespace or control characters, bounded.
_TASK_RE = re.compile(r"^[^\x00-\x20\x7f-\x9f]{1,200}$")


def validate_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise ConfigurationError."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigurationError(
            f"invalid queue name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return name


def new_job_id() -> str:
    """A fresh job id: 32 random hex characters (uuid4's randomness without building a UUID,
    which costs more than the rest of a job on the enqueue hot path)."""
    return os.urandom(16).hex()


def validate_task_name(name: str) -> str:
    """Raise ConfigurationError unless ``name`` is a valid task name; return it."""
    if not isinstance(name, str) or not _TASK_RE.fullmatch(name):
        raise ConfigurationError(
            f"invalid task name {name!r}: use 1-200 printable characters without spaces"
        )
    return name


class JobState(enum.StrEnum):
    """Where a job is in its life. ``scheduled`` is a pending job whose run time is ahead."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


class Job(BaseModel):
    """The envelope of one job, exactly as it is stored and sent.

    Unknown keys are ignored, so a newer producer can talk to an older worker.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    v: Literal[1] = 1
    id: Annotated[str, Field(min_length=1, max_length=64)] = Field(default_factory=new_job_id)
    task: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: Annotated[int, Field(ge=1)] | None = None
    timeout: Annotated[float, Field(gt=0)] | None = None
    dedupe_key: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    run_at: float | None = None
    enqueued_at: float | None = None
    keep_result: Annotated[float, Field(ge=0)] | None = None

    @field_validator("task")
    @classmethod
    def _task_name(cls, value: str) -> str:
        if not _TASK_RE.fullmatch(value):
            raise ValueError(
                "task name must be 1-200 printable characters without spaces or control characters"
            )
        return value

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError("queue name must be 1-128 characters from A-Z a-z 0-9 _ . : -")
        return value

    @classmethod
    def trusted(cls, **fields: Any) -> Job:
        """Build a Job from fields that were already checked (by ``Task.build_job``), without
        validating them again: what ``model_construct`` does, at a quarter of its cost, which
        matters when a batch enqueue builds a hundred thousand jobs a second. Any field not
        given takes its default; ``id`` must be given."""
        values = {**_JOB_DEFAULTS, **fields}  # the defaults' key order is the fields' order
        if "args" not in fields:
            values["args"] = []
        if "kwargs" not in fields:
            values["kwargs"] = {}
        job = cls.__new__(cls)
        object.__setattr__(job, "__dict__", values)
        object.__setattr__(job, "__pydantic_fields_set__", set(fields))
        object.__setattr__(job, "__pydantic_extra__", None)
        object.__setattr__(job, "__pydantic_private__", None)
        return job

    def to_wire(self) -> str:
        """The JSON text brokers store; defaults that are None are left out."""
        return self.model_dump_json(exclude_none=True)


# Every field of Job at its default, for Job.trusted (the ones with factories, None here, are
# always given or filled in there).
_JOB_DEFAULTS: dict[str, Any] = {
    name: None if info.default_factory else info.default for name, info in Job.model_fields.items()
}


def decode_job(raw: bytes | str) -> Job:
    """Decode a wire payload, raising PayloadInvalid with a reason a person can act on."""
    check_payload_size(len(raw))
    try:  # the fast path, in pydantic's Rust parser; the slow one below explains failures
        return Job.model_validate_json(raw)
    except (ValidationError, ValueError, RecursionError):
        return _decode_explaining(raw)


def _decode_explaining(raw: bytes | str) -> Job:
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PayloadInvalid(
                f"payload is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
    try:
        data = json.loads(raw)
    except RecursionError:
        raise PayloadInvalid("payload is nested too deeply to decode; flatten the data") from None
    except ValueError as exc:
        raise PayloadInvalid(f"payload is not valid JSON: {_short(exc)}") from None
    if not isinstance(data, dict):
        raise PayloadInvalid(
            f'payload must be a JSON object like {{"task": ..., "args": [...]}}, '
            f"got {type(data).__name__}"
        )
    try:
        return Job.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}"
            for err in exc.errors()[:5]
        )
        raise PayloadInvalid(f"payload does not match the job schema: {problems}") from None
    except RecursionError:
        raise PayloadInvalid("payload is nested too deeply to decode; flatten the data") from None


def check_payload_size(size: int) -> None:
    """Raise PayloadInvalid when a payload is larger than MAX_PAYLOAD_BYTES."""
    if size > MAX_PAYLOAD_BYTES:
        raise PayloadInvalid(
            f"payload is {size / 1e6:.1f} MB, over the {MAX_PAYLOAD_BYTES // 2**20} MiB limit; "
            "store large data elsewhere and pass a reference (a key, path or URL)"
        )


def peek_task(raw: bytes | str) -> str | None:
    """Best-effort task name of a payload, for listings of jobs that may not decode."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    task = data.get("task") if isinstance(data, dict) else None
    # Only a valid name: brokers store it in columns that cannot hold control characters.
    return task if isinstance(task, str) and _TASK_RE.fullmatch(task) else None


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of one running job: ``token`` is fresh per claim and fences every later write."""

    job_id: str
    token: str
    queue: str


@dataclass(slots=True)
class Delivery:
    """A claimed job as a broker hands it to the core.

    ``payload`` is the wire JSON exactly as stored; the core decodes it (and dead-letters it if it
    cannot). ``attempts`` already counts this claim.
    """

    lease: Lease
    payload: bytes | str
    attempts: int
    lease_until: float

    @property
    def job_id(self) -> str:
        return self.lease.job_id


@dataclass(slots=True)
class JobInfo:
    """What an admin call reports about one job."""

    id: str
    queue: str
    state: JobState
    task: str | None
    attempts: int
    payload: str | bytes
    max_attempts: int | None = None
    priority: int = 0
    run_at: float | None = None
    enqueued_at: float | None = None
    finished_at: float | None = None
    last_error: str | None = None
    result: str | None = None  # JSON text of the kept return value
    dedupe_key: str | None = None
    started_at: float | None = None  # when the latest attempt was claimed
    progress: str | None = None  # JSON text reported by the latest attempt

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the shape of `taskkit dead list --json`)."""
        return {
            "id": self.id,
            "task": self.task,
            "queue": self.queue,
            "state": self.state.value,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "error": self.last_error,
            "run_at": self.run_at,
            "enqueued_at": self.enqueued_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "dedupe_key": self.dedupe_key,
            "result": None if self.result is None else json.loads(self.result),
            "progress": None if self.progress is None else json.loads(self.progress),
        }


@dataclass(slots=True)
class QueueStats:
    """Counts of one queue's jobs by state, plus whether it is paused."""

    ready: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    paused: bool = False
    # When the longest-waiting ready job became due (its run_at); None when nothing is ready.
    # What a queue-stall alert is measured from.
    oldest_ready_at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "scheduled": self.scheduled,
            "running": self.running,
            "dead": self.dead,
            "paused": self.paused,
            "oldest_ready_at": self.oldest_ready_at,
        }


def dead_alert_key(queue: str, task: str | None) -> str:
    """The alert key a dead job is recorded under: one alert per task per queue per window,
    however many of its jobs die. A payload with no readable task name counts as task ``?``."""
    return f"dead:{queue}:{task or '?'}"


def stall_alert_key(queue: str) -> str:
    return f"stall:{queue}"


ALERT_DETAIL_LIMIT = 4000  # characters of the error text an alert keeps


@dataclass(frozen=True, slots=True)
class AlertEvent:
    """Something an operator must hear about: a job went dead, or a queue stalled."""

    key: str  # events with one key merge into one pending alert
    kind: str  # "dead" or "stall"
    queue: str
    task: str | None
    job_id: str | None
    detail: str  # the error text (dead) or a sentence (stall); brokers keep ALERT_DETAIL_LIMIT


@dataclass(slots=True)
class Alert:
    """One row of the alert outbox: the events of one key not yet delivered, merged.

    ``count`` events are waiting (0 once delivered); ``job_id`` and ``detail`` are the latest
    event's. ``next_at`` is the earliest time the alert may be (re)tried: after a claim it is the
    claim's lease, after a failed delivery the backoff, after a delivery the end of the quiet
    window. ``token`` is set on alerts handed out by ``claim_alerts`` and fences ``finish_alert``.
    """

    key: str
    kind: str
    queue: str
    task: str | None
    job_id: str | None
    detail: str
    count: int
    first_at: float
    last_at: float
    next_at: float
    attempts: int = 0
    last_error: str | None = None
    sent_at: float | None = None
    token: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of `taskkit alerts list --json` and of the webhook's ``alert`` field."""
        return {
            "key": self.key,
            "kind": self.kind,
            "queue": self.queue,
            "task": self.task,
            "job_id": self.job_id,
            "detail": self.detail,
            "count": self.count,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "next_at": self.next_at,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "sent_at": self.sent_at,
        }
