"""Structured log lines shared by every pipeserve process.

Each line names the process (node id or component) and a dotted event, then key=value
fields, so `grep 'stage-1 '` or `grep launch.failed` finds the failing node and step.
"""

from __future__ import annotations

import logging
import sys
import time

from orchestrator import settings
from orchestrator.log_limits import LimitedHandler


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created)) + f".{int(record.msecs):03d}"
        fields = getattr(record, "fields", {})
        extra = "".join(f" {k}={_quote(v)}" for k, v in fields.items())
        line = f"{ts} {record.levelname:<5} {record.name} {record.getMessage()}{extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _quote(value: object) -> str:
    text = str(value)
    return repr(text) if (" " in text or not text) else text


class EventLogger:
    """`log.info("stage.listening", address="127.0.0.1:39601")` → one structured line."""

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(f"pipeserve.{name}")
        self.name = name

    def _log(self, level: int, event: str, exc_info: bool, fields: dict[str, object], key: str | None = None) -> None:
        self._logger.log(level, event, exc_info=exc_info, extra={"fields": fields, "collapse_key": key})

    def info(self, event: str, **fields: object) -> None:
        """Log an event at INFO."""
        self._log(logging.INFO, event, False, fields)

    def warning(self, event: str, **fields: object) -> None:
        """Log an event at WARNING."""
        self._log(logging.WARNING, event, False, fields)

    def throttled(self, event: str, key: str = "", level: int = logging.WARNING, **fields: object) -> None:
        """A line that may repeat in a flood (a refusal, a failed request): collapsed by (event, key)
        like every warning, at any level (see log_limits: a few per 10 s, then one summary)."""
        self._log(level, event, False, fields, key)

    def error(self, event: str, exc_info: bool = False, **fields: object) -> None:
        """Log an event at ERROR (with the current traceback when exc_info)."""
        self._log(logging.ERROR, event, exc_info, fields)


def setup(process_name: str, level: str = "INFO") -> EventLogger:
    """Configure stderr logging for a process once, at its entry point; returns its logger. Repeated
    lines are collapsed and, when stderr is the file `PIPESERVE_LOG_FILE` names, it is rotated past
    `PIPESERVE_LOG_MAX_BYTES` (orchestrator/log_limits.py)."""
    handler = LimitedHandler(sys.stderr, settings.LOG_FILE.read(), settings.LOG_MAX_BYTES.read())
    handler.setFormatter(_Formatter())
    root = logging.getLogger("pipeserve")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    return EventLogger(process_name)


def get(name: str) -> EventLogger:
    """A logger for a component; output goes wherever `setup` pointed it."""
    return EventLogger(name)
