"""Wakes the watcher the moment a session's coordinator changes state (the I/O edge).

The watcher looks at every session each `interval` (0.5 s): a stage killed just after a
look was seen up to half a second later, on a recovery's critical path, although its
coordinator knew at once (the stage's socket closed). One thread per watched session
long-polls the coordinator (`GET /health?wait=S&unless=STATE`, engine/coordinator/api.py), which answers
when its pipeline's state changes; the thread then wakes the watcher, whose next cycle judges
the session as always (the agents' process listings, the coordinator's /health). A
coordinator that does not answer (killed: its connection drops) wakes it as well, once.

The wakeup only shortens the wait before a look; what is a fault is still the watcher's and
the orchestrator's decision. Its pauses and its reading of time go through an injectable
`Clock` (orchestrator/proc/clock.py), so a test moves a `FakeClock` instead of sleeping.
"""

from __future__ import annotations

import threading
from typing import Callable

from orchestrator.control.coordinator_client import CoordinatorClient
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock

LONG_POLL_S = 5.0  # the coordinator answers within this even when nothing changed
QUIET_S = 0.5  # after a long poll that did not wait (an older coordinator): no busy loop
RETRY_S = 0.1  # after an error: a refused connection costs little, and a replaced coordinator is
# long-polled again within this of answering (a hung one makes the ask itself wait)


class Wakeup:
    """The long-poll threads of the sessions being watched; `follow` keeps them in step."""

    def __init__(self, wake: Callable[[], None], long_poll_s: float = LONG_POLL_S, quiet_s: float = QUIET_S,
                 retry_s: float = RETRY_S, secret_of: Callable[[str], str | None] = lambda _: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._wake = wake
        self._clock = clock
        self._secret_of = secret_of  # session id -> cluster secret (the control token's source)
        self.long_poll_s = long_poll_s
        self.quiet_s = quiet_s
        self.retry_s = retry_s
        self._lock = threading.Lock()
        self._followed: dict[str, tuple[str, threading.Event]] = {}  # session id -> (coordinator URL, stop)
        self._waiting: set[threading.Event] = set()  # the stop events of threads whose long poll is asked

    def follow(self, sessions: dict[str, str]) -> None:
        """Long-poll exactly these sessions (id -> coordinator URL): start new ones, stop gone ones."""
        with self._lock:
            for sid, (url, stop) in list(self._followed.items()):
                if sessions.get(sid) != url:
                    stop.set()
                    del self._followed[sid]
            for sid, url in sessions.items():
                if sid not in self._followed:
                    stop = threading.Event()
                    self._followed[sid] = (url, stop)
                    client = CoordinatorClient(url, self._secret_of(sid))
                    threading.Thread(target=self._poll, args=(client, stop), name=f"pulse-{sid[:8]}",
                                     daemon=True).start()

    def following(self) -> set[str]:
        """The session ids long-polled now: followed, their coordinator's state known and a long poll
        asked that answers when it changes (a session whose thread has not had its first answer
        yet, or whose coordinator does not answer, is not)."""
        with self._lock:
            return {sid for sid, (_, stop) in self._followed.items() if stop in self._waiting}

    def stop(self) -> None:
        """Stop every thread (each ends after its current long poll at the latest)."""
        self.follow({})

    def _pause(self, stop: threading.Event, seconds: float) -> None:
        """Wait `seconds` on the clock; on the real one `stop` ends the wait at once."""
        if self._clock is SYSTEM_CLOCK:
            stop.wait(seconds)
        else:
            self._clock.sleep(seconds)

    def _asking(self, stop: threading.Event, long_poll: bool) -> None:
        """Record whether the thread of `stop` is asking a long poll now."""
        with self._lock:
            if long_poll:
                self._waiting.add(stop)
            else:
                self._waiting.discard(stop)

    def _poll(self, client: CoordinatorClient, stop: threading.Event) -> None:
        try:
            self._follow_states(client, stop)
        finally:
            self._asking(stop, False)

    def _follow_states(self, client: CoordinatorClient, stop: threading.Event) -> None:
        state: str | None = None  # as last answered; None: not known yet (answered at once)
        failed = False
        while not stop.is_set():
            asked = self._clock.monotonic()
            self._asking(stop, state is not None)
            look = client.health(self.long_poll_s + 5, self.long_poll_s, state)
            params = bool(state)
            if look.busy:  # alive but full: no state learnt, and no reason to look at once
                self._pause(stop, self.quiet_s)
                continue
            if look.report is None:
                if not failed and not stop.is_set():
                    self._wake()  # e.g. the coordinator was killed: look now, not at the next cycle
                failed, state = True, None
                self._pause(stop, self.retry_s)
                continue
            now = look.report.status
            changed = state is not None and now != state
            if (changed or failed) and not stop.is_set():
                self._wake()
            if params and not changed and self._clock.monotonic() - asked < self.quiet_s / 2:
                self._pause(stop, self.quiet_s)  # a long poll that did not wait: never more than one per quiet_s
            # A first answer (no state known) is followed by a long poll at once: a second fault
            # right after a recovery is heard as soon as the first.
            failed, state = False, now
