"""The exceptions taskkit users see.

Every error taskkit raises derives from ``TaskkitError``. Driver errors (redis, asyncpg, sqlite3)
are translated at the broker boundary, so user code never has to catch a driver exception::

    TaskkitError
    ├── ConfigurationError          bad settings: fix the code or the command line
    │   ├── BrokerURLError          a broker URL that cannot be parsed or names no known scheme
    │   ├── DuplicateTaskName       two task definitions under one name
    │   └── AppImportError          `module:attribute` that does not lead to a router
    ├── BrokerError                 the broker failed to do what it was asked
    │   ├── BrokerUnavailable       the server cannot be reached (retry later)
    │   └── SchemaMissing           the broker's storage is missing or old (run `taskkit migrate`)
    ├── LeaseLost                   a worker no longer owns the job it tried to touch
    ├── EnqueueError                a job was refused at enqueue; nothing was stored
    │   └── ArgumentsInvalid        arguments that do not fit the task's signature
    ├── JobNotFound                 the broker keeps nothing under that job id
    ├── JobDead                     waited for a result, but the job went dead (or was cancelled)
    ├── ResultTimeout               waited for a result longer than the timeout (a TimeoutError)
    └── JobFailure                  why a job did not complete (raised inside the worker)
        ├── JobTimeout              the handler ran past its timeout (retryable)
        ├── UnknownTask             no task of that name is registered (dead at once)
        └── PayloadInvalid          the payload cannot be decoded (dead at once)
"""

from __future__ import annotations


class TaskkitError(Exception):
    """Base of every exception taskkit raises."""


class ConfigurationError(TaskkitError):
    """A setting, URL or definition is wrong; the message says how to fix it."""


class BrokerURLError(ConfigurationError):
    """A broker URL cannot be parsed, or its scheme names no installed broker."""


class DuplicateTaskName(ConfigurationError):
    """Two different task definitions were registered under one name."""


class AppImportError(ConfigurationError):
    """`module:attribute` could not be imported or is not a router/app."""


class BrokerError(TaskkitError):
    """The broker failed to carry out an operation."""


class BrokerUnavailable(BrokerError):
    """The broker's server cannot be reached. Safe to retry after a pause."""


class SchemaMissing(BrokerError):
    """The broker's tables or keys are missing or at an old version."""


class LeaseLost(TaskkitError):
    """The caller's lease token no longer owns the job (it expired and was reclaimed)."""


class EnqueueError(TaskkitError):
    """A job was refused at enqueue time; nothing was stored."""


class ArgumentsInvalid(EnqueueError):
    """The arguments do not fit the task's signature."""


class JobNotFound(TaskkitError):
    """The broker keeps nothing under that job id."""


class JobDead(TaskkitError):
    """The job whose result was awaited went to the dead letters; ``error`` says why."""

    def __init__(self, job_id: str, error: str | None) -> None:
        first = (error or "no error recorded").splitlines()[0]
        super().__init__(f"job {job_id} is dead: {first}")
        self.job_id = job_id
        self.error = error


class ResultTimeout(TaskkitError, TimeoutError):
    """The job did not finish within the time the caller was willing to wait."""


class JobFailure(TaskkitError):
    """Base of the failures the worker records on a job."""


class JobTimeout(JobFailure):
    """The handler ran past its timeout and was cancelled. Counts as a retryable failure."""


class UnknownTask(JobFailure):
    """No task is registered under the job's task name. The job goes dead at once."""


class PayloadInvalid(JobFailure):
    """The job's payload cannot be decoded or has the wrong shape. The job goes dead at once."""
