"""How much CPU time a process has used: the sign of progress in one that has stopped answering.

A process that does not answer may be dead, frozen (SIGSTOP), deadlocked, or busy (a long native
call holding Python's lock). Only the last one burns CPU: the watcher asks its agent for this
figure to tell a busy coordinator from a stuck one, as the coordinator tells a slow stage from a
wedged one by its step counters.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of `pid` (all its threads), or None where it cannot be read
    (no /proc, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of stat)
    except (OSError, ValueError, IndexError):
        return None


__all__ = ["cpu_seconds"]
