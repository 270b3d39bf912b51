"""The one way pipeserve writes a file that must never be seen half-written or by other users.

A temporary file in the same directory (created 0600 by `mkstemp`, so never world-readable,
not even for a moment), written, fsync'ed, given its final mode, then `os.replace`d over the
target; on any failure the temporary file is removed and the target is untouched. Readers
see the old file or the new one, never a mix. Used for the agent's identity, credentials and
records, the control plane's state, secrets and downloads, the dashboard's auth store and the
router YAML the registrar edits.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PRIVATE = 0o600


def write_atomically(path: str | os.PathLike[str], data: bytes | str, mode: int = PRIVATE,
                     durable_rename: bool = False) -> None:
    """Replace `path` with `data` atomically, mode `mode` (default owner-only).

    `durable_rename` also fsyncs the directory, so a crash right after cannot bring the old
    file back (the router YAML, which another program reads).
    """
    target = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if mode != PRIVATE:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable_rename:
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
