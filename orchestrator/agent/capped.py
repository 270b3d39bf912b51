"""A file object that refuses any byte past the size a download was admitted with.

The hub's listing (or a peer's) names each file's size; free disk space is checked against
those sizes before anything starts. A source that then sends more — a lying hub listing 1,000
bytes and streaming 200 MiB — must not write it: the write that would pass the size raises
`DownloadError` ("oversized", partial files deleted), so every byte written stays within what
was admitted.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from orchestrator.agent.jobs import DownloadError


class CappedWriter:
    """Wraps `f` (positioned anywhere): writing past absolute offset `limit` raises DownloadError."""

    def __init__(self, f: BinaryIO, limit: int, what: str) -> None:
        self._f = f
        self.limit = limit
        self.what = what

    def write(self, data: bytes) -> int:
        """Write `data` unless it would end past `limit`."""
        if self._f.tell() + len(data) > self.limit:
            raise DownloadError(f"{self.what}: the source sent more than the {self.limit} bytes it announced",
                                "oversized", [self.what])
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:  # seek, tell, truncate, flush, fileno: the file's own
        return getattr(self._f, name)


__all__ = ["CappedWriter"]
