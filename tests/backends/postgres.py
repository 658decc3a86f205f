"""PostgreSQL backend for the broker matrix: one schema per test on a real server.

The server is ``TASKKIT_TEST_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1:5432/test).
Each space gets a fresh schema named after the test, migrated once and dropped at the end. When
nothing answers, the test fails with a message saying so: it is never skipped.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from brokers.postgres import PostgresBroker, parse_url
from taskkit.broker import redact_url
from taskkit.errors import BrokerUnavailable

from . import BrokerSpace

NAME = "postgres"
URL_ENV = "TASKKIT_TEST_POSTGRES_URL"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/test"


def server_url() -> str:
    """The test server's URL (without a schema)."""
    return os.environ.get(URL_ENV) or DEFAULT_URL


def schema_url(base: str, schema: str) -> str:
    """``base`` with ``schema=`` set (replacing any schema it had)."""
    parts = urlsplit(base)
    query = [p for p in parts.query.split("&") if p and not p.startswith("schema=")]
    query.append(f"schema={schema}")
    return urlunsplit(parts._replace(query="&".join(query)))


def unique_schema(test_id: str) -> str:
    """A schema name derived from the test, unique even when a crashed run left one behind."""
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in test_id.lower())[:38]
    return f"tk_{stem}_{secrets.token_hex(3)}"


async def drop_schema(url: str) -> None:
    """Drop the schema ``url`` names, with everything in it."""
    options = parse_url(url)
    conn = await asyncpg.connect(options.dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{options.schema}" CASCADE')
    finally:
        await conn.close()


@asynccontextmanager
async def migrated_schema(test_id: str) -> AsyncIterator[str]:
    """A freshly migrated schema on the test server; yields its broker URL, drops it at exit."""
    base = server_url()
    url = schema_url(base, unique_schema(test_id))
    try:
        await PostgresBroker(url).migrate()
    except BrokerUnavailable as exc:
        pytest.fail(
            f"PostgreSQL test server not reachable at {redact_url(base)}: {exc}\n"
            f"Start one (e.g. pg_ctl start) or point {URL_ENV} at a server.",
            pytrace=False,
        )
    try:
        yield url
    finally:
        await drop_schema(url)


@asynccontextmanager
async def space(test_id: str, tmp_path: Path) -> AsyncIterator[BrokerSpace]:
    """An isolated, migrated schema for one test."""
    async with migrated_schema(test_id) as url:
        yield BrokerSpace(NAME, url, lambda: PostgresBroker(url))
