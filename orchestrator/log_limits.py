"""What keeps a process's log from filling a disk: repeated lines collapsed, the file rotated by size.

A flood (refused connections, malformed requests, a peer failing its handshake in a loop)
once wrote 62k lines, 6.6 MB in minutes, and a stage's log 40 MB in 90 s. Two limits, both
in the one handler every process logs through (`logs.setup`):

- **Collapse.** Every WARNING or ERROR, and any line logged as repeatable (`EventLogger.throttled`),
  is keyed by (logger, level, event, key): the key given, else every field (identical lines).
  The first `burst` lines of a key in a window of
  `window_s` seconds are written; the rest are counted, and when the window ends one line
  says "… and N more like it in the last 10 s" (written by a timer, so it appears even when
  the flood has stopped and nothing else is logged).
- **Rotation by size.** When the file its stderr writes to (named by `PIPESERVE_LOG_FILE`,
  which `ChildProcess.spawn` sets for every child) grows past `max_bytes`, it is renamed to
  `<file>.1` (replacing the previous one) and a fresh file takes its place on stdout and
  stderr (`dup2`), so whatever the process or its native libraries print lands in it too.
  At most about twice the cap stays on disk per process.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

WINDOW_S = 10.0  # a repeated line is written at most BURST times per this
BURST = 5
MAX_KEYS = 1024  # keys remembered at once (many sources: the oldest are forgotten)


@dataclass
class _Window:
    start: float
    logged: int = 0
    held: int = 0
    last: logging.LogRecord | None = None  # the latest line held back: the summary repeats its fields


class Collapser:
    """Which lines of a key to write (pure bookkeeping on an injected `now`; not thread-safe alone)."""

    def __init__(self, window_s: float = WINDOW_S, burst: int = BURST, max_keys: int = MAX_KEYS) -> None:
        self.window_s, self.burst, self.max_keys = window_s, burst, max_keys
        self._windows: dict[tuple, _Window] = {}

    def admit(self, key: tuple, record: logging.LogRecord, now: float) -> tuple[bool, list[_Window]]:
        """(write this line?, windows that ended with lines held back: their summaries are due)."""
        due = self.due(now)
        w = self._windows.get(key)
        if w is None:
            if len(self._windows) >= self.max_keys:
                self._windows.pop(next(iter(self._windows)))
            w = self._windows[key] = _Window(now)
        if w.logged < self.burst:
            w.logged += 1
            return True, due
        w.held += 1
        w.last = record
        return False, due

    def due(self, now: float) -> list[_Window]:
        """Remove and return the windows that have ended; those with lines held back need a summary."""
        ended = [k for k, w in self._windows.items() if now - w.start >= self.window_s]
        return [w for w in (self._windows.pop(k) for k in ended) if w.held]

    def next_end(self) -> float | None:
        """When the earliest window holding lines back ends (None: nothing held)."""
        ends = [w.start + self.window_s for w in self._windows.values() if w.held]
        return min(ends) if ends else None

    def drain(self) -> list[_Window]:
        """Every window with lines held back (the process is ending: say them now)."""
        held = [w for w in self._windows.values() if w.held]
        self._windows.clear()
        return held


def summary(w: _Window, window_s: float) -> logging.LogRecord:
    """The line that stands for the lines a window held back."""
    assert w.last is not None
    rec = logging.makeLogRecord(w.last.__dict__)
    rec.msg = f"{w.last.getMessage()} … and {w.held} more like it in the last {window_s:g} s"
    rec.args = None
    rec.exc_info = rec.exc_text = None  # one traceback per burst is enough
    rec.created = time.time()
    rec.msecs = (rec.created % 1) * 1000
    rec.collapse_key = None  # written as is
    return rec


def collapse_key(record: logging.LogRecord) -> tuple | None:
    """The key a line is collapsed by, or None for a line always written (an ordinary INFO).

    A line logged with a key (`EventLogger.throttled`: a refusal by source and reason) is
    collapsed by it; any other warning only with lines identical to it (every field equal)."""
    key = getattr(record, "collapse_key", None)
    if key is None:
        if record.levelno < logging.WARNING:
            return None
        fields = getattr(record, "fields", None) or {}
        key = tuple((k, str(v)[:200]) for k, v in fields.items())
    return (record.name, record.levelno, record.msg, key)


class LimitedHandler(logging.StreamHandler):
    """A stream handler that collapses repeated lines and rotates its file by size (see the module)."""

    def __init__(self, stream, log_file: Path | None = None, max_bytes: int = 0, window_s: float = WINDOW_S,
                 burst: int = BURST, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(stream)
        self.log_file, self.max_bytes, self.window_s = log_file, max_bytes, window_s
        self._collapser = Collapser(window_s, burst)
        self._clock = clock
        self._timer: threading.Timer | None = None
        self._limits = threading.RLock()

    def emit(self, record: logging.LogRecord) -> None:
        key = collapse_key(record)
        if key is None:
            self._write(record)
            return
        with self._limits:
            write, due = self._collapser.admit(key, record, self._clock())
            self._arm_timer()
        for w in due:
            self._write(summary(w, self.window_s))
        if write:
            self._write(record)

    def _arm_timer(self) -> None:
        end = self._collapser.next_end()
        if end is None or (self._timer is not None and self._timer.is_alive()):
            return
        self._timer = threading.Timer(max(0.0, end - self._clock()) + 0.01, self._flush_due)
        self._timer.daemon = True
        self._timer.start()

    # Lock order, everywhere: the handler's own lock (taken by `handle` around `emit`) before
    # `_limits`. The timer and `close` take it themselves, as `handle` would.

    def _flush_due(self) -> None:
        self.acquire()
        try:
            with self._limits:
                due = self._collapser.due(self._clock())
                self._timer = None
                self._arm_timer()
            for w in due:
                self._write(summary(w, self.window_s))
        finally:
            self.release()

    def close(self) -> None:
        self.acquire()
        try:
            with self._limits:
                held = self._collapser.drain()
                if self._timer is not None:
                    self._timer.cancel()
            for w in held:
                self._write(summary(w, self.window_s))
        finally:
            self.release()
        super().close()

    def _write(self, record: logging.LogRecord) -> None:
        super().emit(record)
        if self.log_file is not None and self.max_bytes > 0:
            with self._limits:
                self._rotate_if_due()

    def _rotate_if_due(self) -> None:
        try:
            fd = self.stream.fileno()
            st = os.fstat(fd)
            if st.st_size <= self.max_bytes:
                return
            named = os.stat(self.log_file)
        except (OSError, ValueError, AttributeError):
            return
        if (named.st_dev, named.st_ino) != (st.st_dev, st.st_ino):
            return  # stderr is not that file (an inherited setting, a redirect): not ours to rotate
        self.flush()
        os.replace(self.log_file, self.log_file.with_name(self.log_file.name + ".1"))
        fresh = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o600)
        try:
            for target in {fd, 1, 2}:
                try:
                    same = os.fstat(target)
                except OSError:
                    continue
                if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino):
                    os.dup2(fresh, target)  # stdout and stderr alike: native output follows the rotation
        finally:
            os.close(fresh)
