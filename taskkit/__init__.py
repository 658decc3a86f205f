"""taskkit: background tasks for Python with pluggable brokers and at-least-once delivery."""

from taskkit.app import App, JobHandle
from taskkit.broker import Broker, broker_from_url, redact_url
from taskkit.errors import (
    ArgumentsInvalid,
    BrokerError,
    BrokerUnavailable,
    BrokerURLError,
    ConfigurationError,
    DuplicateTaskName,
    EnqueueError,
    JobDead,
    JobTimeout,
    LeaseLost,
    PayloadInvalid,
    ResultTimeout,
    SchemaMissing,
    TaskkitError,
    UnknownTask,
)
from taskkit.job import Job, JobInfo, JobState
from taskkit.retry import Backoff, RetryPolicy
from taskkit.router import Router
from taskkit.task import Task, task
from taskkit.worker import Worker, WorkerSettings, run_worker

__all__ = [
    "App",
    "ArgumentsInvalid",
    "Backoff",
    "Broker",
    "BrokerError",
    "BrokerURLError",
    "BrokerUnavailable",
    "ConfigurationError",
    "DuplicateTaskName",
    "EnqueueError",
    "Job",
    "JobDead",
    "JobHandle",
    "JobInfo",
    "JobState",
    "JobTimeout",
    "LeaseLost",
    "PayloadInvalid",
    "ResultTimeout",
    "RetryPolicy",
    "Router",
    "SchemaMissing",
    "Task",
    "TaskkitError",
    "UnknownTask",
    "Worker",
    "WorkerSettings",
    "broker_from_url",
    "redact_url",
    "run_worker",
    "task",
]
