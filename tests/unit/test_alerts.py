"""The alert message: its body, its one-line text, and what of the webhook URL may be shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from taskkit import WorkerSettings
from taskkit.alerts import DeliveryFailed, alert_text, post_json, redact_webhook, webhook_body
from taskkit.job import Alert


def alert(**kw: object) -> Alert:
    fields: dict[str, object] = {
        "key": "dead:default:pay.charge", "kind": "dead", "queue": "default",
        "task": "pay.charge", "job_id": "j1", "detail": "RuntimeError: no\nTraceback ...",
        "count": 3, "first_at": 1.0, "last_at": 2.0, "next_at": 2.0,
    }  # fmt: skip
    return Alert(**{**fields, **kw})  # type: ignore[arg-type]


def test_the_body_is_generic_json_with_a_chat_text() -> None:
    body = webhook_body(alert(token="secret-token"), "w1")
    assert body["text"] == (
        "taskkit: job j1 of pay.charge on queue default is dead (3 events): RuntimeError: no"
    )
    assert body["source"] == "taskkit" and body["worker"] == "w1"
    assert body["alert"]["count"] == 3 and "token" not in body["alert"]
    assert alert_text(alert(kind="stall", count=1, detail="waited 90s")) == (
        "taskkit: queue default is stalled: waited 90s"
    )


def test_only_the_webhooks_host_is_ever_shown() -> None:
    url = "https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX"
    assert redact_webhook(url) == "https://hooks.slack.com/***"
    with pytest.raises(DeliveryFailed) as failed:
        post_json("http://127.0.0.1:1/services/secret", {}, timeout=2)
    assert "secret" not in str(failed.value) and "127.0.0.1:1" in str(failed.value)


@pytest.mark.parametrize("bad", ["ftp://h/x", "http://", "http://[::1", "hooks.example.com/x"])
def test_a_webhook_must_be_an_http_url_with_a_host(bad: str) -> None:
    with pytest.raises(ValidationError, match="http:// or https:// URL with a host"):
        WorkerSettings(alert_webhook=bad)
