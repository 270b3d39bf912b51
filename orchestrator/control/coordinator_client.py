"""The control plane's one client of a coordinator's HTTP API (the I/O edge).

Launcher, watcher, its wakeup and recovery read `GET /health` through `CoordinatorClient.health`,
which turns whatever came back into a `HealthLook`: the coordinator's verdict (a typed
`HealthReport`), *busy* (it answered "come back later": alive, no verdict), or no answer.
A 429, an error document, or JSON that is not a health report is never a verdict: a full
server's refusal once read as "coordinator None: None" and tore a healthy cluster down.

Every request carries the cluster's control token (`engine/health_report.control_token`),
so the coordinator serves it in slots that anonymous clients cannot hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import requests
from pydantic import ValidationError

from orchestrator.engine.coordinator.health_report import CONTROL_HEADER, HealthReport, control_token
from orchestrator.engine.stage_address import ROUTE_PATH, SIGNATURE_HEADER, sign


@dataclass(frozen=True)
class HealthLook:
    """One look at a coordinator's health: a verdict, busy, or silence (with why)."""

    report: HealthReport | None = None  # the coordinator's own verdict on its pipeline
    busy: bool = False  # it answered "too many connections / requests, retry later": alive, no verdict
    error: str = ""  # why there is no verdict ("" when there is one)
    status: int | None = None  # the HTTP status, None when nothing answered

    @property
    def answered(self) -> bool:
        """Whether the coordinator process answered at all (a verdict or busy)."""
        return self.report is not None or self.busy


def read_health(status: int, body: bytes) -> HealthLook:
    """Classify one `/health` answer (pure): only a health report on a 200 (ready) or a 503
    (not ready) is a verdict; a 429 or an overload document is busy; anything else is not an answer."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        doc = None
    error = doc.get("error") if isinstance(doc, dict) else None
    if status == 429 or (isinstance(error, dict) and error.get("type") == "rate_limit_error"):
        return HealthLook(busy=True, error=f"busy (HTTP {status})", status=status)
    if status not in (200, 503) or error is not None or not isinstance(doc, dict):
        return HealthLook(error=f"HTTP {status}: not a health report", status=status)
    try:
        report = HealthReport.model_validate(doc)
    except ValidationError as exc:
        return HealthLook(error=f"HTTP {status}: not a health report ({exc.error_count()} errors)", status=status)
    if report.ready != (status == 200):
        return HealthLook(error=f"HTTP {status}: a health report that contradicts its status", status=status)
    return HealthLook(report=report, status=status)


def unreachable(exc: requests.RequestException) -> str:
    """Why a coordinator did not answer, in words (pure): this reaches the session's reason and
    every page, where urllib3's nested repr ("HTTPConnectionPool(host=…): Max retries exceeded
    … NewConnectionError(…)") once stood."""
    text = str(exc)
    if isinstance(exc, requests.Timeout):
        return "no answer in time"
    for needle, words in (("Connection refused", "connection refused (no process listens on its port)"),
                          ("Connection reset", "connection reset"),
                          ("RemoteDisconnected", "it closed the connection without answering"),
                          ("No route to host", "no route to its host"),
                          ("Network is unreachable", "network unreachable"),
                          ("Name or service not known", "unknown host name")):
        if needle in text:
            return words
    return "no answer (the connection failed)"


class CoordinatorClient:
    """Talks to one session's coordinator at `url` with its cluster `secret` (None: anonymous)."""

    def __init__(self, url: str, secret: str | bytes | None = None) -> None:
        self.url = url.rstrip("/")
        self._secret = secret.encode() if isinstance(secret, str) else secret
        self._headers = {CONTROL_HEADER: control_token(self._secret)} if self._secret else {}

    def health(self, timeout: float, wait_s: float = 0.0, unless: str | None = None) -> HealthLook:
        """`GET /health`; with `unless` and `wait_s`, a long poll answered when the state is another."""
        params = {"wait": wait_s, "unless": unless} if unless and wait_s > 0 else {}
        for attempt in range(2):
            try:
                r = requests.get(self.url + "/health", params=params, headers=self._headers, timeout=timeout)
            except requests.ConnectionError as exc:
                # Refused or reset: asked again once at once (a flooded server may have dropped
                # this connection; a dead one refuses the second as fast as the first).
                if attempt == 0 and not isinstance(exc, requests.ConnectTimeout):
                    continue
                return HealthLook(error=unreachable(exc))
            except requests.RequestException as exc:
                return HealthLook(error=unreachable(exc))
            return read_health(r.status_code, r.content)
        raise AssertionError("unreachable")

    def metrics(self, timeout: float) -> str | None:
        """The Prometheus text of `GET /metrics`, None when it does not answer 200."""
        try:
            r = requests.get(self.url + "/metrics", headers=self._headers, timeout=timeout)
        except requests.RequestException:
            return None
        return r.text if r.status_code == 200 else None

    def move_stage(self, body: bytes, timeout: float) -> requests.Response:
        """`POST` a signed stage-address move (`engine/stage_address.py`); raises requests.RequestException."""
        if not self._secret:
            raise ValueError("a stage move needs the cluster secret")
        headers = {**self._headers, SIGNATURE_HEADER: sign(self._secret, body), "Content-Type": "application/json"}
        return requests.post(self.url + ROUTE_PATH, data=body, headers=headers, timeout=timeout)


__all__ = ["CoordinatorClient", "HealthLook", "read_health", "unreachable"]
