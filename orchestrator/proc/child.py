"""One child process: spawned in its own session with its output in a log file, waited for
until a probe says it is ready, and stopped with SIGTERM then SIGKILL of its process group.

Its own session (process group) makes a stop reach everything the child spawned, and keeps a
terminal's Ctrl-C away from it: the parent decides the order of stops. Output goes to a file,
not a pipe, so a chatty child never blocks on a full pipe and its last lines can be shown
when it fails. A child can also be *attached* by pid (an agent re-adopting the engine
processes of its previous run): then there is no exit status, and liveness is judged by the
pid and the process's identity (its start time), so a recycled pid is not mistaken for it.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TypeVar

from orchestrator import settings
from orchestrator.proc.clock import SYSTEM_CLOCK, Clock
from orchestrator.proc.wait import WaitTimeout, wait_until

T = TypeVar("T")
STOP_TIMEOUT_S = 10.0  # between SIGTERM and SIGKILL, and after SIGKILL before giving up


class ProcState(str, Enum):
    """Where a child is in its life. Moves only forward, except STOPPING → RUNNING when a stop
    failed (the process survived SIGKILL: it is still there, and may be stopped again)."""

    RUNNING = "running"    # started (or attached) and not known to have exited
    STOPPING = "stopping"  # a stop was decided (signals sent or about to be)
    EXITED = "exited"      # gone, reaped by us: exit_code or signal say how
    VANISHED = "vanished"  # gone, but attached (not our child): how it ended is unknown

    @property
    def gone(self) -> bool:
        """Whether the process has ended."""
        return self in (ProcState.EXITED, ProcState.VANISHED)


class ChildError(RuntimeError):
    """A child exited or did not become ready in time; the message carries its last output."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def parent_death_signal() -> None:
    """`preexec_fn` for a child that must not outlive its parent: on Linux the kernel sends it
    SIGTERM when the thread that started it ends (the parent killed included); elsewhere nothing."""
    _die_with_parent()


@dataclass(eq=False)
class ChildProcess:
    """A child process and what is known about it. Thread-safe for `alive()` and `stop()`."""

    name: str
    pid: int
    log_path: Path | None = None
    popen: subprocess.Popen | None = field(default=None, repr=False)
    identity: str | None = None  # of an attached child: what `identify(pid)` said when it was ours
    identify: Callable[[int], str | None] | None = field(default=None, repr=False)
    state: ProcState = ProcState.RUNNING
    exit_code: int | None = None
    signal: str | None = None  # the name of the signal that ended it
    clock: Clock = field(default=SYSTEM_CLOCK, repr=False)
    started_at: float | None = None  # wall time of a spawn: a rotated log older than it is a former run's
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    # --- starting ----------------------------------------------------------------------

    @classmethod
    def spawn(cls, name: str, argv: list[str], log_path: Path, *, env: Mapping[str, str] | None = None,
              cwd: Path | None = None, append: bool = False, die_with_parent: bool = False,
              clock: Clock = SYSTEM_CLOCK) -> "ChildProcess":
        """Start `argv` in a new session, stdin from /dev/null, stdout and stderr into `log_path`
        (created 0600; appended to with `append`, else truncated). `die_with_parent` asks Linux
        to SIGTERM the child when the thread that started it ends — only for a parent that
        starts children from its main thread and wants them gone if it is killed."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Always O_APPEND: once the child rotates its log (logs.setup, past PIPESERVE_LOG_MAX_BYTES)
        # every writer of the old description must land at an end, never at a stale offset.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        started_at = time.time()
        out = os.open(log_path, flags, 0o600)
        child_env = dict(settings.process_environment() if env is None else env)
        child_env[settings.LOG_FILE.name] = str(log_path.resolve())  # the file it may rotate
        try:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=child_env, cwd=cwd, start_new_session=True,
                                     close_fds=True, preexec_fn=_die_with_parent if die_with_parent else None)
        finally:
            os.close(out)  # the child holds its own copy
        return cls(name, popen.pid, log_path, popen=popen, clock=clock, started_at=started_at)

    @classmethod
    def attach(cls, name: str, pid: int, identity: str | None, identify: Callable[[int], str | None], *,
               log_path: Path | None = None, clock: Clock = SYSTEM_CLOCK) -> "ChildProcess":
        """A child started by an earlier incarnation of this program, known by pid and identity."""
        return cls(name, pid, log_path, identity=identity, identify=identify, clock=clock)

    # --- observing ---------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        """Whether this is an attached child (no exit status will be known)."""
        return self.popen is None

    def alive(self) -> bool:
        """Whether the process still runs; when it does not, the state becomes EXITED (a spawned
        child, reaped, its exit code or signal noted) or VANISHED (an attached one)."""
        with self._lock:
            if self.state.gone:
                return False
            if self._running():
                return True
            self.state = ProcState.EXITED if self.popen is not None else ProcState.VANISHED
            return False

    def _running(self) -> bool:
        if self.popen is not None:
            code = self.popen.poll()
            if code is None:
                return True
            if code >= 0:
                self.exit_code = code
            else:
                try:
                    self.signal = signal.Signals(-code).name
                except ValueError:
                    self.signal = f"signal {-code}"
            return False
        try:
            os.kill(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return self.identify is None or self.identify(self.pid) == self.identity

    @property
    def returncode(self) -> int | None:
        """The exit status as subprocess reports it (negative: killed by that signal); None while running."""
        self.alive()
        return None if self.popen is None else self.popen.returncode

    def output_lines(self, tail: int = 40) -> list[str]:
        """The last `tail` lines the child printed (stdout and stderr together)."""
        lines: list[str] = []
        for path in reversed(self._log_files()):  # the newest file first, the rotated one when it is short
            try:
                with open(path, "rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    f.seek(max(0, size - 256 * tail - 4096))  # enough for `tail` ordinary lines
                    data = f.read()
            except OSError:
                continue
            lines = data.decode(errors="replace").splitlines() + lines
            if len(lines) >= tail:
                break
        return lines[-tail:]

    def _log_files(self) -> list[Path]:
        """The log's files, oldest first: the rotated `<log>.1` (see log_limits) and the log itself."""
        if self.log_path is None:
            return []
        rotated = self.log_path.with_name(self.log_path.name + ".1")
        try:
            ours = self.started_at is None or rotated.stat().st_mtime >= self.started_at
        except OSError:
            ours = False
        return [rotated, self.log_path] if ours else [self.log_path]

    def output(self, tail: int = 40) -> str:
        """`output_lines` as one text, for error messages."""
        return "\n".join(self.output_lines(tail)) or "(no output)"

    def printed(self, pattern: str) -> str | None:
        """The first group of regular expression `pattern` in everything printed so far."""
        for path in self._log_files():  # what it printed first may have been rotated out already
            try:
                m = re.search(pattern, path.read_text(errors="replace"))
            except OSError:
                continue
            if m:
                return m.group(1)
        return None

    def describe_exit(self) -> str:
        """"exited with status N", "killed by SIGX" or "exited" (attached: status unknown)."""
        if self.signal:
            return f"killed by {self.signal}"
        return f"exited with status {self.exit_code}" if self.exit_code is not None else "exited"

    def wait_ready(self, probe: Callable[[], T], what: str, timeout: float, interval: float = 0.05,
                   ignore: tuple[type[BaseException], ...] = (Exception,)) -> T:
        """Poll `probe()` until it returns something truthy and return that. ChildError with the
        child's output when it exits first or `timeout` passes. Exceptions of the `ignore`
        types (by default any) mean "not up yet"."""
        last_error: list[BaseException] = []

        def check() -> T | None:
            if not self.alive():  # outside `ignore`: a dead child ends the wait at once
                raise ChildError(f"{self.name} {self.describe_exit()} before {what}:\n{self.output()}")
            try:
                return probe()
            except ignore as exc:
                last_error[:] = [exc]
                return None

        try:
            return wait_until(check, timeout, interval, what, clock=self.clock)
        except WaitTimeout:
            detail = f" (last error: {last_error[0]!r})" if last_error else ""
            raise ChildError(f"{self.name}: timed out after {timeout:g} s waiting for {what}{detail}:\n"
                             f"{self.output()}") from None

    # --- stopping ----------------------------------------------------------------------

    def send(self, sig: int) -> None:
        """Send `sig` to the process alone (not its group); nothing if it is gone."""
        if self.alive():
            try:
                os.kill(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def signal_group(self, sig: int) -> None:
        """Send `sig` to the child's process group (it leads it: it was started in a new session)."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def claim_stop(self) -> bool:
        """Mark a RUNNING child STOPPING, so that of several deciders only one stops it; False
        when it is not running (gone, or someone else is stopping it)."""
        with self._lock:
            if self.state is not ProcState.RUNNING or not self.alive():
                return False
            self.state = ProcState.STOPPING
            return True

    def release_stop(self) -> None:
        """Undo `claim_stop` when no stop happened after all: RUNNING again, unless it exited."""
        with self._lock:
            if self.state is ProcState.STOPPING and self.alive():
                self.state = ProcState.RUNNING

    def terminate(self) -> bool:
        """SIGTERM the process group and mark the child STOPPING; False when it had already exited."""
        with self._lock:
            if not self.alive():
                return False
            self.state = ProcState.STOPPING
        self.signal_group(signal.SIGTERM)
        return True

    def wait_exit(self, timeout: float, interval: float = 0.02) -> bool:
        """Whether the child is gone within `timeout` seconds (reaped, when spawned)."""
        try:
            wait_until(lambda: not self.alive(), timeout, interval, f"{self.name} to exit", clock=self.clock)
            return True
        except WaitTimeout:
            return False

    def stop(self, timeout: float = STOP_TIMEOUT_S, on_kill: Callable[[], None] | None = None) -> None:
        """SIGTERM the group, SIGKILL it after `timeout` s (calling `on_kill` first), and SIGKILL
        the group once more when the child is gone, for anything it left behind in it. Nothing
        when the child had already exited.

        Returns once the child is confirmed gone; ChildError if it survived SIGKILL (then it
        is RUNNING again, so a later stop may retry)."""
        if not self.terminate():
            return  # already gone: its pid may be another process's by now, so no group signal
        if not self.wait_exit(timeout):
            if on_kill is not None:
                on_kill()
            self.signal_group(signal.SIGKILL)
            if not self.wait_exit(STOP_TIMEOUT_S):
                with self._lock:
                    self.state = ProcState.RUNNING
                raise ChildError(f"{self.name} (pid {self.pid}) survived SIGKILL")
        self.signal_group(signal.SIGKILL)


def stop_all(children: Iterable[ChildProcess], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop children together: SIGTERM to all first, then wait for each (SIGKILL after `timeout`)."""
    children = list(children)
    for c in children:
        c.terminate()
    for c in children:
        try:
            c.stop(timeout)
        except ChildError:
            continue  # the others must still be stopped; the survivor is RUNNING and reported by the caller
