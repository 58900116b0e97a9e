"""Where alert transitions go besides the store: the log, and webhooks (Alertmanager-style JSON, with retries)."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone

import httpx

log = logging.getLogger(__name__)


def alert_payload(alerts: list[dict]) -> dict:
    """Alertmanager's webhook shape: `status` (firing if any fires), `alerts` with labels and annotations."""
    items = []
    for alert in alerts:
        labels = {"alertname": alert["rule"], "severity": alert["severity"]}
        for key in ("instance", "session_id"):
            if alert.get(key):
                labels[key] = alert[key]
        items.append(
            {
                "status": alert["state"],
                "labels": labels,
                "annotations": {"summary": alert["summary"]},
                "startsAt": datetime.fromtimestamp(alert["ts"], timezone.utc).isoformat(),
                "value": alert["value"],
            }
        )
    status = "firing" if any(a["state"] == "firing" for a in alerts) else "resolved"
    return {"version": "4", "status": status, "receiver": "kvobs", "alerts": items}


class LogSink:
    def send(self, alerts: list[dict]) -> None:
        for alert in alerts:
            level = logging.WARNING if alert["state"] == "firing" else logging.INFO
            log.log(level, "[%s] %s %s: %s", alert["severity"], alert["rule"], alert["state"], alert["summary"])


class WebhookSink:
    """POST each batch of transitions as JSON; retried with backoff on errors and 5xx, then logged and counted."""

    def __init__(self, url: str, *, tries: int = 3, backoff_s: float = 0.5, timeout_s: float = 5.0) -> None:
        self.url = url
        self.tries = tries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.num_failed = 0

    def send(self, alerts: list[dict]) -> None:
        payload = alert_payload(alerts)
        for attempt in range(1, self.tries + 1):
            try:
                response = httpx.post(self.url, json=payload, timeout=self.timeout_s)
                if response.status_code < 500:
                    if response.status_code >= 400:
                        log.error("webhook %s refused the alerts: HTTP %d", self.url, response.status_code)
                        self.num_failed += 1
                    return
                error = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                error = repr(exc)
            if attempt < self.tries:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        self.num_failed += 1
        log.error(
            "webhook %s failed %d times (last: %s); %d alert transitions not delivered",
            self.url,
            self.tries,
            error,
            len(alerts),
        )
