"""Dead-letter alerts end to end: `taskkit worker --alert-webhook` against a real HTTP server
that is down at first, and `taskkit alerts list` showing the outbox, on every server broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.backends import BrokerSpace
from tests.servers import free_port
from tests.webhook import WebhookServer

from .helpers import Output, run_cli, start_worker, stop_workers, wait_until
from .test_cli import TASKS

pytestmark = pytest.mark.anyio


def alerts(project: Path, url: str, *flags: str) -> list[dict[str, object]]:
    done = run_cli(project, "alerts", "list", "--json", "--broker", url, *flags)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


async def test_an_alert_waits_in_the_outbox_until_the_webhook_is_up(
    server_space: BrokerSpace, tmp_path: Path
) -> None:
    url = server_space.url
    assert url is not None
    (tmp_path / "clitasks.py").write_text(TASKS)
    port = free_port()
    hook_url = f"http://127.0.0.1:{port}/hooks/s3cr3t-path"  # nothing listens there yet
    for _ in range(3):
        done = run_cli(tmp_path, "enqueue", "clitasks:router", "calc.fail", "--broker", url)
        assert done.returncode == 0, done.stderr
    worker = start_worker(
        "clitasks:router", url, tmp_path, "--alert-webhook", hook_url, worker_id="alerter"
    )
    output = Output(worker)
    try:
        wait_until(
            lambda: any(a["attempts"] for a in alerts(tmp_path, url)), 30, "a failed delivery"
        )
        [pending] = alerts(tmp_path, url)
        assert pending["key"] == "dead:math:calc.fail" and pending["count"] == 3
        assert "cannot reach http://127.0.0.1" in str(pending["last_error"])
        text = run_cli(tmp_path, "alerts", "list", "--broker", url).stdout
        assert "dead:math:calc.fail  pending x3" in text and "1 pending alert(s)" in text
        with WebhookServer(port=port) as hook:
            # The next try comes after the backoff (5 s).
            wait_until(lambda: len(hook.accepted) == 1, 30, "the alert to be delivered")
            wait_until(lambda: alerts(tmp_path, url) == [], 10, "the outbox to be empty")
    finally:
        codes = stop_workers([worker], [output])
    [body] = hook.accepted
    assert body["alert"]["count"] == 3 and body["alert"]["task"] == "calc.fail"  # type: ignore[index]
    assert "always fails" in body["text"]
    [sent] = alerts(tmp_path, url, "--all")
    assert sent["count"] == 0 and sent["sent_at"] is not None
    assert codes == [0], output.notable()
    assert "s3cr3t" not in output.text, "the webhook's secret path must not be logged"
