"""What the OS says about an engine process: its identity (start time) and whether it listens on a port."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from orchestrator.agent.report import command_output


def process_identity(pid: int) -> str | None:
    """Something that tells this process apart from a later one with the same pid: its start time.

    None when it is not running — a zombie included: an engine process whose agent died was
    re-parented, and until its new parent reaps it, it still answers `kill(pid, 0)`.
    """
    if Path("/proc").is_dir():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return None if stat[0] in ("Z", "X") else stat[19]  # field 3, state; field 22, starttime
        except (OSError, IndexError):
            return None
    return command_output(["ps", "-o", "lstart=", "-p", str(pid)]) or None


def port_listening(host: str, port: int, pid: int | None = None) -> bool:
    """Whether `port` is listening — by process `pid` when given (a stage listens only once its
    layers are loaded; another program holding the port must not count as the stage).

    On Linux the kernel's socket table answers without touching the listener: a test
    connection would make the stage log a refused handshake on every status poll.
    """
    tables = [Path("/proc/net/tcp"), Path("/proc/net/tcp6")]
    if tables[0].exists():
        wanted = f":{port:04X}"
        inodes: set[str] = set()
        for table in tables:
            try:
                lines = table.read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if len(fields) > 9 and fields[1].endswith(wanted) and fields[3] == "0A":  # 0A = LISTEN
                    inodes.add(fields[9])
        if not inodes or pid is None:
            return bool(inodes)
        return _owns_socket(pid, inodes)
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _owns_socket(pid: int, inodes: set[str]) -> bool:
    """Whether process pid holds one of these socket inodes (True if its fds cannot be read)."""
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return True
    targets = {f"socket:[{i}]" for i in inodes}
    for fd in fds:
        try:
            if os.readlink(fd) in targets:
                return True
        except OSError:
            continue
    return False
