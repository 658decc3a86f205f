"""Log output for ``taskkit worker``: the usual text lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from taskkit.broker import redact_url

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", ...}`` plus the job fields that taskkit's job
    events carry (``job_id``, ``task``, ``queue``, ``attempt``, ``duration``, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "taskkit", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class RedactingFilter(logging.Filter):
    """Last line of defence: mask a password in any URL that reaches a log message."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "://" in message and "@" in message:
            record.msg = " ".join(
                redact_url(word) if "://" in word and "@" in word else word
                for word in message.split(" ")
            )
            record.args = None
        return True


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Send logs to stderr as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
