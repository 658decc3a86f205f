"""The Redis broker's URL, options and error messages (no server needed, except where a closed
port is the point)."""

from __future__ import annotations

import re
import socket
import time

import pytest

from brokers.redis import _SCRIPTS, DEFAULT_PREFIX, QueueKeys, RedisBroker
from taskkit.broker import broker_from_url
from taskkit.errors import BrokerError, BrokerUnavailable, BrokerURLError
from tests import servers
from tests.backends import redis as backend

pytestmark = pytest.mark.anyio
SECRET = "s3cr3t-pw"


def test_prefix_comes_from_the_url_and_is_stripped_before_redis_sees_it() -> None:
    b = RedisBroker("redis://127.0.0.1:6379/2?prefix=app.jobs&socket_timeout=5")
    assert b.prefix == "app.jobs"
    assert b._redis_url == "redis://127.0.0.1:6379/2?socket_timeout=5"
    assert RedisBroker("redis://127.0.0.1").prefix == DEFAULT_PREFIX
    assert RedisBroker("redis://h/0?prefix=a", prefix="b").prefix == "b", "keyword wins"


def test_taskkit_options_from_the_url() -> None:
    b = RedisBroker("rediss://h/0?dead_max=5&dead_ttl=60&processing_grace=7.5")
    assert (b.dead_max, b.dead_ttl, b.processing_grace) == (5, 60.0, 7.5)
    assert b._redis_url == "rediss://h/0"


@pytest.mark.parametrize(
    "url",
    [
        f"redis://:{SECRET}@h/0?prefix=a{{b}}",
        f"redis://:{SECRET}@h/0?prefix=",
        f"redis://:{SECRET}@h/0?prefix=-dash",
        f"redis://:{SECRET}@h/0?prefix=" + "x" * 129,
        f"redis://:{SECRET}@h/0?prefix=a*b",
        f"redis://:{SECRET}@h/0?dead_max=lots",
        f"redis://:{SECRET}@h/0?processing_grace=0",
        f"redis://:{SECRET}@h:99999/0",
        f"http://:{SECRET}@h/0",
    ],
)
def test_bad_urls_are_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(BrokerURLError) as caught:
        RedisBroker(url)
    assert SECRET not in str(caught.value)


def test_repr_hides_the_password() -> None:
    b = RedisBroker(f"redis://user:{SECRET}@h:6380/0?prefix=p")
    assert SECRET not in repr(b) and "***" in repr(b)


def test_broker_from_url_builds_a_redis_broker() -> None:
    assert isinstance(broker_from_url("redis://127.0.0.1:6379/0?prefix=x"), RedisBroker)
    assert isinstance(broker_from_url("rediss://127.0.0.1:6379/0"), RedisBroker)


async def test_an_unreachable_server_is_one_readable_line_naming_the_redacted_url() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = RedisBroker(f"redis://:{SECRET}@127.0.0.1:{port}/0?prefix=p")
    with pytest.raises(BrokerUnavailable) as caught:
        await b.connect()
    message = str(caught.value)
    assert SECRET not in message and "\n" not in message
    assert f"redis://:***@127.0.0.1:{port}/0" in message
    await b.close()  # never connected: a no-op


async def test_an_unknown_redis_option_is_a_url_error_at_connect() -> None:
    b = RedisBroker("redis://127.0.0.1:1/0?no_such_option=1")
    with pytest.raises(BrokerURLError, match="no_such_option"):
        await b.connect()


async def test_using_a_broker_before_connect_says_so() -> None:
    with pytest.raises(BrokerError, match="not connected"):
        await RedisBroker(f"redis://:{SECRET}@h/0").stats(0.0)


def test_every_key_of_a_queue_carries_its_hash_tag() -> None:
    k = QueueKeys("app", "mail:eu")
    keys = [*k.fixed, k.processing("b1"), k.done("j1")]
    assert len(set(keys)) == len(keys) == 21
    for key in keys:
        assert key.startswith("app:{mail:eu}:")
        assert re.findall(r"\{([^}]*)\}", key) == ["mail:eu"]


def test_scripts_are_all_there_and_documented() -> None:
    assert set(_SCRIPTS) == {
        "enqueue", "push_raw", "claim", "reclaim", "recover", "extend", "settle", "release",
        "get", "list_dead", "requeue", "purge", "stats", "cancel", "progress",
        "alert_record", "alert_claim", "alert_finish", "rate", "slot_acquire", "slot_extend",
    }  # fmt: skip
    for script in _SCRIPTS.values():
        assert "KEYS[1..19]" in script.text  # the layout header travels with every script
        assert f"--!script {script.name}" not in script.text


def test_connections_time_out_and_keep_alive_unless_told_otherwise() -> None:
    defaults = RedisBroker("redis://h/0")._redis_options
    assert defaults["socket_timeout"] == defaults["socket_connect_timeout"] == 5.0
    assert defaults["socket_keepalive"] is True
    assert RedisBroker("redis://h/0", socket_timeout=None)._redis_options["socket_timeout"] is None


@pytest.mark.parametrize(
    ("query", "block_max"), [("", 4.0), ("&socket_timeout=1.5", 0.75), ("&socket_timeout=30", 29.0)]
)
async def test_a_blmove_wait_stays_under_the_socket_timeout(
    request: pytest.FixtureRequest, query: str, block_max: float
) -> None:
    """A frozen server or a dropped connection cannot hang a BLMOVE past the socket timeout,
    and a wait longer than the timeout is served in several BLMOVEs (the URL wins)."""
    url = servers.ensure_redis()
    prefix = backend.unique_prefix(request.node.name)
    b = RedisBroker(backend.with_prefix(url, prefix) + query)
    await b.connect()
    try:
        assert b._block_max == block_max
        wait = 2.0 if block_max < 1 else 0.2  # longer than the socket timeout of 1.5 s
        started = time.monotonic()
        assert await b.reserve(["default"], 1, 30, wait, time.time()) == []
        assert wait - 0.1 < time.monotonic() - started < wait + 2
    finally:
        await backend.delete_prefix(b.client, prefix)
        await b.close()
