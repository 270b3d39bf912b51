"""Time as a dependency: the system's clocks, or a fake one that tests move by hand.

Code that enforces leases or TTLs, or polls, takes a `Clock` instead of calling `time`
directly, so a test can let a lease lapse by advancing a `FakeClock` instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (for deadlines that are persisted or shown), monotonic time (for waiting) and sleep."""

    def time(self) -> float:
        """Seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let `seconds` pass."""
        ...


class SystemClock:
    """The real clocks."""

    def time(self) -> float:
        """`time.time()`."""
        return time.time()

    def monotonic(self) -> float:
        """`time.monotonic()`."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """`time.sleep()`."""
        time.sleep(seconds)


SYSTEM_CLOCK = SystemClock()  # stateless: sharing one instance is safe


class FakeClock:
    """A clock that moves only when told to: `advance(s)`, or `sleep(s)` (which advances at once).

    Thread-safe. Both readings move together, `time()` from `start` and `monotonic()` from 0.
    `sleep` also yields the CPU for a moment, so a thread polling on this clock lets the
    thread it waits for (a real child process being reaped, say) make progress.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._lock = threading.Lock()
        self._start = start
        self._elapsed = 0.0

    def time(self) -> float:
        """The fake wall time."""
        with self._lock:
            return self._start + self._elapsed

    def monotonic(self) -> float:
        """The fake monotonic time."""
        with self._lock:
            return self._elapsed

    def advance(self, seconds: float) -> None:
        """Move both readings forward."""
        if seconds < 0:
            raise ValueError("a clock does not go back")
        with self._lock:
            self._elapsed += seconds

    def sleep(self, seconds: float) -> None:
        """Advance by `seconds` (no real waiting beyond a yield)."""
        self.advance(max(0.0, seconds))
        time.sleep(0.001)
