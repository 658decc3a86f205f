"""PostgresBroker URL handling: taskkit's options are taken out, the rest reaches asyncpg."""

from __future__ import annotations

import pytest

from brokers.postgres import PostgresBroker, parse_url
from taskkit.broker import broker_from_url
from taskkit.errors import BrokerURLError


def test_taskkit_options_are_stripped_and_the_rest_kept() -> None:
    opts = parse_url(
        "postgresql://u:pw@db.example:6543/app?sslmode=require&schema=jobs_1&listen=0"
        "&prepared=false&pool_size=4&application_name=web"
    )
    assert opts.dsn == "postgresql://u:pw@db.example:6543/app?sslmode=require&application_name=web"
    assert (opts.schema, opts.listen, opts.prepared, opts.pool_size) == ("jobs_1", False, False, 4)
    assert opts.channel == "taskkit.jobs_1"


def test_defaults() -> None:
    opts = parse_url("postgres://localhost/db")
    assert opts.dsn == "postgres://localhost/db"
    assert (opts.schema, opts.listen, opts.prepared, opts.pool_size) == ("taskkit", True, True, 10)


@pytest.mark.parametrize(
    "schema",
    ['x";drop schema public;--', "1abc", "a-b", "a.b", "", "x" * 49, "%22x%22"],
)
def test_schema_names_that_could_inject_sql_are_refused(schema: str) -> None:
    with pytest.raises(BrokerURLError, match="invalid schema"):
        parse_url(f"postgresql://localhost/db?schema={schema}")


@pytest.mark.parametrize("query", ["listen=maybe", "prepared=2", "pool_size=0", "pool_size=x"])
def test_bad_option_values_are_refused(query: str) -> None:
    with pytest.raises(BrokerURLError):
        parse_url(f"postgresql://u:secret@localhost/db?{query}")


def test_errors_and_repr_never_show_the_password() -> None:
    with pytest.raises(BrokerURLError) as info:
        parse_url("postgresql://u:secret@localhost/db?schema=bad-name")
    assert "secret" not in str(info.value) and "***" in str(info.value)
    assert "secret" not in repr(PostgresBroker("postgresql://u:secret@localhost/db"))


def test_the_broker_is_found_by_scheme() -> None:
    for scheme in ("postgresql", "postgres"):
        assert isinstance(broker_from_url(f"{scheme}://localhost/db"), PostgresBroker)
