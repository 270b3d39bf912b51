"""The one way to follow an agent's job (a download, a copy, a profile) to its end.

An agent answers a long job at once and runs it in the background; the caller polls its
state until it is no longer "running". Every caller — the client's `wait_download`, the
Models tab's downloads through agent restarts, Prepare on all nodes, a stage's copy to
another node, the timing of a model's layers — goes through `follow_job`, so the rules are
the same everywhere: the caller's cancel flag is checked before every poll (and wakes the
wait at once), progress is handed to `on_running`, the deadline is kept by `wait_until` on
an injectable clock, and a timeout is a `JobTimeout` naming the job.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from orchestrator.proc.clock import SYSTEM_CLOCK, Clock
from orchestrator.proc.wait import WaitTimeout, wait_until


class JobState(Protocol):
    """What a job's poll answers: at least its state."""

    state: str


J = TypeVar("J", bound=JobState)


class JobCancelled(Exception):
    """The caller's cancel flag ended the wait (the job itself is the caller's to cancel)."""


class JobTimeout(TimeoutError):
    """The job was still running at the deadline; the message names it."""


class _CancelClock:
    """`clock`, whose sleep also ends the moment `cancel` is set (the real clock only)."""

    def __init__(self, clock: Clock, cancel: threading.Event) -> None:
        self._clock, self._cancel = clock, cancel

    def time(self) -> float:
        return self._clock.time()

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def sleep(self, seconds: float) -> None:
        if self._clock is SYSTEM_CLOCK:
            self._cancel.wait(seconds)
        else:
            self._clock.sleep(seconds)


def follow_job(poll: Callable[[], J | None], what: str, timeout_s: float, poll_s: float = 0.25, *,
               cancel: threading.Event | None = None, on_running: Callable[[J], None] | None = None,
               clock: Clock = SYSTEM_CLOCK) -> J:
    """Poll until the job is no longer running; return its last state.

    `poll()` answers the job's state, or None for "no answer yet, keep waiting" (an agent
    that is restarting). Exceptions from `poll` propagate: a caller's own rule ends the
    wait early. Raises JobCancelled when `cancel` is set, JobTimeout after `timeout_s`.
    """
    def settled() -> J | None:
        if cancel is not None and cancel.is_set():
            raise JobCancelled(what)
        info = poll()
        if info is None or info.state == "running":
            if info is not None and on_running is not None:
                on_running(info)
            return None
        return info

    waiting_clock = clock if cancel is None else _CancelClock(clock, cancel)
    try:
        return wait_until(settled, timeout_s, poll_s, message=what, clock=waiting_clock)
    except WaitTimeout:
        raise JobTimeout(f"{what} still running after {timeout_s:.0f} s") from None
