from __future__ import annotations

import pytest

from brokers.sqlite import SqliteBroker
from taskkit.broker import broker_from_url, redact_url, resolve_broker_url
from taskkit.errors import BrokerURLError


def test_url_precedence_flag_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TASKKIT_BROKER_URL", raising=False)
    assert resolve_broker_url(None) == "sqlite:///taskkit.db"
    monkeypatch.setenv("TASKKIT_BROKER_URL", "memory://env")
    assert resolve_broker_url(None) == "memory://env"
    assert resolve_broker_url("memory://flag") == "memory://flag"


def test_the_default_broker_is_sqlite_in_the_working_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TASKKIT_BROKER_URL", raising=False)
    broker = broker_from_url()
    assert isinstance(broker, SqliteBroker) and broker.path.endswith("/taskkit.db")


def test_an_unknown_scheme_lists_the_known_ones_and_hides_the_password() -> None:
    with pytest.raises(BrokerURLError) as err:
        broker_from_url("amqp://user:hunter2@127.0.0.1/")
    assert "sqlite" in str(err.value) and "redis" in str(err.value)
    assert "hunter2" not in str(err.value)


def test_a_url_without_scheme_is_one_clear_error() -> None:
    with pytest.raises(BrokerURLError, match="no scheme"):
        broker_from_url("just-a-path.db")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        (
            "postgresql://app:s3cret@127.0.0.1/db?sslmode=require",
            "postgresql://app:***@127.0.0.1/db?sslmode=require",
        ),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://u:s3cret@[::1]:99999/0", "redis://***"),
    ],
)
def test_redact_url_hides_passwords(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_brokers_repr_hides_the_password() -> None:
    broker = broker_from_url("memory://x")
    assert repr(broker) == "MemoryBroker('memory://x')"
