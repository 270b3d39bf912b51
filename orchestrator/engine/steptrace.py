"""Timestamps of a running pipeline's steps, in every process: where a token's time goes between them.

A profile of one process in isolation (engine/profiling/step.py) cannot show what a stage boundary
costs while the other stages compute on the same cores. With `PIPESERVE_STEP_TRACE=<file>` every
stage and the coordinator note, per step, when its input was read (a stage's upstream reader thread
marks "read", in marks of its own) and ready, when its output was evaluated and when it was sent;
`perf_counter` is the monotonic clock every process of a machine shares, so one file orders them all
(`e2e/bench/paths.py --pipeline` reads it). Marks are kept in memory and appended in batches: one
write per `FLUSH_EVERY` marks, never a file operation per step. Off (no file set), nothing is recorded
and `StepTrace.of` gives None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from orchestrator import settings

FLUSH_EVERY = 64  # marks held before they are appended to the file


class StepTrace:
    """One process's marks: `mark(event)` notes the time of an event of the current step."""

    def __init__(self, path: Path, who: str) -> None:
        self.path = path
        self.who = who
        self._marks: list[tuple[float, str]] = []

    @classmethod
    def of(cls, who: str) -> "StepTrace | None":
        """This process's trace when PIPESERVE_STEP_TRACE names a file, else None."""
        path = settings.STEP_TRACE.read()
        return cls(path, who) if path is not None else None

    def mark(self, event: str) -> None:
        """Note that `event` happened now."""
        self._marks.append((time.perf_counter(), event))
        if len(self._marks) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Append the marks held to the file (one write: whole lines from this process)."""
        marks, self._marks = self._marks, []
        if marks:
            data = "".join(f"{t:.6f} {self.who} {event}\n" for t, event in marks).encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)


def read(path: Path) -> list[tuple[float, str, str]]:
    """A trace file's marks, (time, process, event), in time order."""
    marks = []
    for line in path.read_text().splitlines():
        t, who, event = line.split(" ", 2)
        marks.append((float(t), who, event))
    return sorted(marks)


__all__ = ["FLUSH_EVERY", "StepTrace", "read"]
