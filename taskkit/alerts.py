"""Alerts: from the broker's outbox to a webhook (seed 003's alert outbox).

A job that goes dead records an alert in the broker in the same step as the dead letter, so an
alert cannot be lost between the two. Workers started with ``--alert-webhook URL`` then deliver
pending alerts: each is claimed under a lease, POSTed as JSON, and marked sent; a failed POST
stays in the outbox and is tried again with backoff (5 s doubling up to 10 min). Alerts are
merged by key (``dead:QUEUE:TASK`` or ``stall:QUEUE``): after one is delivered, that key stays
quiet for ``alert_window`` seconds and the events of the window go out together, with their
count, when it ends. So a flood of dead jobs is one message per task per window.

With ``--stall-after SECONDS`` the workers also record a ``stall:QUEUE`` alert when a queue's
oldest ready job has waited longer than that (a queue nobody drains, or one that drains too
slowly). Paused queues are left out: they are stalled on purpose.

The body is generic JSON with a ``text`` field, which Slack and Microsoft Teams incoming
webhooks display as the message::

    {"text": "...", "source": "taskkit", "worker": "...", "alert": {...Alert.to_dict()...}}
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread

from taskkit.broker import Broker
from taskkit.clock import Clock
from taskkit.errors import TaskkitError
from taskkit.job import Alert, AlertEvent, stall_alert_key
from taskkit.retry import Backoff

log = logging.getLogger("taskkit.alerts")

DELIVERY_BACKOFF = Backoff(base=5.0, factor=2.0, cap=600.0)
CLAIM_LEASE = 60.0  # seconds a claimed alert is ours: more than a slow POST with its timeout
POST_TIMEOUT = 10.0
STALL_CHECK_EVERY = 5.0


class DeliveryFailed(Exception):
    """The webhook did not take the alert; the message says why in one line."""


def check_webhook(url: str) -> str:
    """Raise ValueError unless ``url`` is an http(s) URL with a host; return it."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. an unclosed [IPv6 bracket
        ok = False
    if not ok:
        raise ValueError("must be an http:// or https:// URL with a host")
    return url


def redact_webhook(url: str) -> str:
    """Scheme, host and port only: webhook paths and queries are secrets (Slack's are keys)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<webhook>"
    return f"{parts.scheme}://{host}{port}/***"


def alert_text(alert: Alert) -> str:
    """One human line (plus the error's first line) for chat tools."""
    first = alert.detail.split("\n", 1)[0]
    more = f" ({alert.count} events)" if alert.count > 1 else ""
    if alert.kind == "dead":
        what = f"taskkit: job {alert.job_id} of {alert.task or '?'} on queue {alert.queue} is dead"
    else:
        what = f"taskkit: queue {alert.queue} is stalled"
    return f"{what}{more}: {first}"


def webhook_body(alert: Alert, worker_id: str) -> dict[str, Any]:
    return {
        "text": alert_text(alert),
        "source": "taskkit",
        "worker": worker_id,
        "alert": alert.to_dict(),
    }


def post_json(url: str, body: dict[str, Any], timeout: float = POST_TIMEOUT) -> None:
    """POST ``body`` as JSON; any answer but 2xx raises DeliveryFailed. Blocking."""
    data = json.dumps(body).encode()
    try:
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        raise DeliveryFailed(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DeliveryFailed(f"cannot reach {redact_webhook(url)}: {reason}") from None
    except Exception as exc:  # a malformed URL or reply: a failed delivery, never a dead worker
        raise DeliveryFailed(f"{type(exc).__name__} posting to {redact_webhook(url)}") from None
    if not 200 <= status < 300:
        raise DeliveryFailed(f"HTTP {status}")


class AlertDispatcher:
    """The worker's alert loop: check for stalled queues, deliver pending alerts."""

    def __init__(
        self,
        broker: Broker,
        clock: Clock,
        worker_id: str,
        *,
        webhook: str | None,
        window: float,
        stall_after: float | None,
        every: float,
        on_result: Callable[[Alert, str | None], None] | None = None,
    ) -> None:
        self.broker = broker
        self.clock = clock
        self.worker_id = worker_id
        self.webhook = webhook
        self.window = window
        self.stall_after = stall_after
        self.every = every
        self.on_result = on_result  # (alert, None) when sent, (alert, error) when not
        self._next_stall_check = 0.0

    async def run(self) -> None:
        while True:
            try:
                await self.check_stalls()
                if self.webhook is not None:
                    while await self.deliver_due():
                        pass
            except TaskkitError as exc:
                log.warning("alert loop: broker call failed (%s); will retry", exc)
            except Exception:  # alerts must never take the worker down with them
                log.exception("alert loop failed; will retry")
            await anyio.sleep(self.every)

    async def check_stalls(self) -> None:
        """Record a stall alert for each unpaused queue whose oldest ready job is older than
        ``stall_after``; at most every few seconds."""
        now = self.clock.now()
        if self.stall_after is None or now < self._next_stall_check:
            return
        self._next_stall_check = now + min(STALL_CHECK_EVERY, self.stall_after / 2)
        for queue, stats in (await self.broker.stats(now)).items():
            oldest = stats.oldest_ready_at
            if stats.paused or oldest is None or now - oldest <= self.stall_after:
                continue
            waited = now - oldest
            detail = (
                f"the oldest of {stats.ready} ready jobs has waited {waited:.0f}s "
                f"(threshold {self.stall_after:g}s); {stats.running} running: are workers "
                f"serving queue {queue!r}, and are they keeping up?"
            )
            event = AlertEvent(stall_alert_key(queue), "stall", queue, None, None, detail)
            await self.broker.record_alert(event, now)

    async def deliver_due(self, limit: int = 10) -> int:
        """Claim due alerts and POST each; returns how many were claimed."""
        assert self.webhook is not None
        alerts = await self.broker.claim_alerts(limit, CLAIM_LEASE, self.clock.now())
        for alert in alerts:
            await self._deliver(alert, self.webhook)
        return len(alerts)

    async def _deliver(self, alert: Alert, webhook: str) -> None:
        error: str | None = None
        try:
            await anyio.to_thread.run_sync(post_json, webhook, webhook_body(alert, self.worker_id))
        except DeliveryFailed as exc:
            error = str(exc)
        now = self.clock.now()
        if error is None:
            kept = await self.broker.finish_alert(alert, True, now + self.window, None, now)
            log.info("alert %s sent (%d events)", alert.key, alert.count)
        else:
            retry_at = now + DELIVERY_BACKOFF.delay(alert.attempts + 1)
            kept = await self.broker.finish_alert(alert, False, retry_at, error, now)
            log.warning(
                "alert %s not delivered (%s); stays in the outbox, next try in %.0fs",
                alert.key,
                error,
                retry_at - now,
            )
        if not kept:
            log.warning("alert %s: our claim ran out meanwhile; another worker has it", alert.key)
        if self.on_result is not None:
            self.on_result(alert, error)
