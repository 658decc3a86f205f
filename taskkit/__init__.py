"""taskkit: background tasks for Python with pluggable brokers and at-least-once delivery."""

from taskkit.app import App, JobHandle, SyncApp, SyncJobHandle
from taskkit.broker import Broker, broker_from_url, redact_url
from taskkit.context import JobContext, JobProgress, Retry, Snooze, current_job, report_progress
from taskkit.errors import (
    ArgumentsInvalid,
    BrokerError,
    BrokerUnavailable,
    BrokerURLError,
    ConfigurationError,
    DuplicateTaskName,
    EnqueueError,
    JobDead,
    JobNotFound,
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
    "JobContext",
    "JobDead",
    "JobHandle",
    "JobInfo",
    "JobNotFound",
    "JobProgress",
    "JobState",
    "JobTimeout",
    "LeaseLost",
    "PayloadInvalid",
    "ResultTimeout",
    "Retry",
    "RetryPolicy",
    "Router",
    "SchemaMissing",
    "Snooze",
    "SyncApp",
    "SyncJobHandle",
    "Task",
    "TaskkitError",
    "UnknownTask",
    "Worker",
    "WorkerSettings",
    "broker_from_url",
    "current_job",
    "redact_url",
    "report_progress",
    "run_worker",
    "task",
]
