"""Emulated nodes: one CPU core each, by affinity (what `taskset -a -p` does, from Python).

Node k is core k of the cores this process may use. `pin(pid, cores)` pins every thread of a
process and of its descendants (a thread created later inherits its creator's affinity, so a
sweep after start covers the BLAS and MLX threads made at import); `pin_again` repeats the sweep
before each measurement, for threads a server made since.
"""

from __future__ import annotations

import os
from pathlib import Path


def node_cores(nodes: int) -> list[int]:
    """The cores of `nodes` emulated nodes: the first `nodes` cores this process may run on."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < nodes:
        raise SystemExit(f"{nodes} emulated nodes need {nodes} cores; this process may use {len(cores)}")
    return cores[:nodes]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc/*/stat parent ids)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += parents.get(p, [])
    return out


def pin(pid: int, cores: set[int] | list[int]) -> int:
    """Pin every thread of `pid` and of its descendants to `cores`; returns how many threads."""
    count = 0
    for proc in descendants(pid):
        for task in Path(f"/proc/{proc}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), set(cores))
                count += 1
            except (OSError, ValueError):  # a thread that ended meanwhile
                pass
    return count


def affinity(pid: int) -> set[int]:
    """The cores the threads of `pid` may run on (their union)."""
    cores: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            cores |= os.sched_getaffinity(int(task.name))
        except OSError:
            pass
    return cores
