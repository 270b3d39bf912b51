"""`wait_until`: poll a condition until it holds, or fail saying what was awaited."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from orchestrator.proc.clock import SYSTEM_CLOCK, Clock

T = TypeVar("T")


class WaitTimeout(TimeoutError):
    """The condition did not hold in time; the message names it (and the last error, if any)."""


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05,
               message: str = "the condition", *, ignore: tuple[type[BaseException], ...] = (),
               clock: Clock = SYSTEM_CLOCK) -> T:
    """Call `predicate()` every `interval` seconds until it returns something truthy; return that.

    Raises WaitTimeout naming `message` after `timeout` seconds. Exceptions of the types in
    `ignore` count as "not yet" (a server that does not answer while it starts up); any
    other exception propagates at once, so a predicate can fail the wait early (a child
    process that died). The predicate is always tried at least once, and once more after
    the deadline, so a slow final poll cannot lose a condition that became true.
    """
    deadline = clock.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        expired = clock.monotonic() >= deadline
        try:
            value = predicate()
        except ignore as exc:
            value, last_error = None, exc  # type: ignore[assignment]
        if value:
            return value
        if expired:
            detail = f" (last error: {last_error!r})" if last_error is not None else ""
            raise WaitTimeout(f"timed out after {timeout:g} s waiting for {message}{detail}")
        clock.sleep(interval)
