"""Find pipeserve processes by a marker in their command line (a state directory), to clean up.

A stack started locally (the demo, a test's agents) names its own directory on every
command line it runs, the engine processes its agents start included. Whatever went wrong
before — an earlier run killed with SIGKILL, a test that failed half-way — the processes
that name that directory are that stack's, and only those are killed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path


def _ancestors() -> set[int]:
    """This process and its ancestors (their command lines may name the directory too)."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def marked_processes(marker: str) -> list[int]:
    """Pids of pipeserve processes (`python -m orchestrator.cli ...`: agents, router, dashboard,
    stages, coordinators) whose command line contains `marker`; never this process or its
    ancestors. Empty where there is no /proc."""
    needle, ours = marker.encode(), _ancestors()
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            pid = int(proc_dir.name)
            argv = (proc_dir / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if pid not in ours and b"orchestrator.cli" in argv and any(needle in a for a in argv):
            found.append(pid)
    return found


def kill_marked(marker: str) -> list[int]:
    """SIGKILL the `marked_processes(marker)`; returns the pids signalled."""
    killed = []
    for pid in marked_processes(marker):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            continue
    return killed
