"""No password from a broker URL ever reaches output: errors, logs, reprs, `taskkit info`."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest

from .helpers import run_cli
from .test_cli import TASKS

SECRET = "Pa55w0rd-never-printed"


def _with_secret(url: str) -> str:
    parts = urlsplit(url)
    user = parts.username or ""
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    return parts._replace(netloc=f"{user}:{SECRET}@{host}").geturl()


def urls() -> list[str]:
    redis = os.environ.get("TASKKIT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    postgres = os.environ.get(
        "TASKKIT_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
    )
    return [
        f"redis://:{SECRET}@127.0.0.1:1/0",  # nothing listens
        f"postgresql://app:{SECRET}@127.0.0.1:1/app",  # nothing listens
        _with_secret(redis),  # a server that refuses the password (or wants none)
        _with_secret(postgres) + "?schema=security_check",  # trust auth: accepted
        f"amqp://guest:{SECRET}@127.0.0.1/",  # unknown scheme
        f"sqlite://user:{SECRET}@host/x.db",  # malformed for its scheme
    ]


@pytest.mark.parametrize(
    "url",
    urls(),
    ids=["redis-down", "pg-down", "redis-auth", "pg-trust", "unknown", "sqlite-netloc"],
)
def test_no_command_prints_the_password(tmp_path: Path, url: str) -> None:
    (tmp_path / "clitasks.py").write_text(TASKS)
    commands = [
        ["migrate", "--broker", url],
        ["info", "--broker", url],
        ["info", "--json", "--broker", url],
        ["enqueue", "clitasks:router", "calc.add", "--args", "[1, 2]", "--broker", url],
        ["worker", "clitasks:router", "--burst", "--log-level", "DEBUG", "--broker", url],
        ["worker", "clitasks:router", "--burst", "--log-format", "json", "--broker", url],
        ["dead", "list", "--json", "--broker", url],
    ]
    try:
        for command in commands:
            result = run_cli(tmp_path, *command, timeout=60)
            output = result.stdout + result.stderr
            assert SECRET not in output, f"{command[0]} printed the password:\n{output}"
            assert "Traceback" not in output, output
    finally:
        if "schema=security_check" in url:
            anyio.run(_drop_schema, url.split("?")[0])


async def _drop_schema(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP SCHEMA IF EXISTS security_check CASCADE")
    finally:
        await conn.close()
