"""A download job's state and progress, and the errors a download can end with.

Written by the job's worker thread, read by API threads (under the job's lock), so the
progress a client polls is always a consistent snapshot.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.agent.schemas import DownloadInfo, FileEntry, Manifest

RATE_WINDOW_S = 3.0


class DownloadError(Exception):
    """A download failed; `code` is a stable word, `files` the files concerned.

    `keep_partial`: a later fetch of the same model can resume from the partial files (the
    network went away, a ticket expired); otherwise the failed job's partial files are deleted.
    """

    def __init__(self, message: str, code: str = "download_failed", files: list[str] | None = None,
                 keep_partial: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.files = files or []
        self.keep_partial = keep_partial


class DiskSpaceError(DownloadError):
    """Not enough free space for the download; nothing was started."""


class Conflict(DownloadError):
    """A download of this model with another manifest or source is already running."""


class Cancelled(Exception):
    """The job was cancelled."""


class Job:
    """One model's download: progress counters written by its worker, read by anyone."""

    def __init__(self, model_id: str, source: str, key: str, manifest: Manifest | None) -> None:
        self.model_id, self.source, self.key = model_id, source, key
        self.manifest = manifest
        self.cancel = threading.Event()
        self.discard = False
        self.lock = threading.Lock()
        self.state = "running"
        self.total_bytes = manifest.total_bytes if manifest else 0
        self.files_total = len(manifest.files) if manifest else 0
        self.files_done = 0
        self.completed_bytes = 0  # files verified (or reused) so far
        self.current_bytes = 0  # bytes on disk of the file in progress
        self.transferred_bytes = self.resumed_bytes = self.reused_bytes = 0
        self.current_file: str | None = None
        self.error: str | None = None
        self.error_code: str | None = None
        self.mismatched: list[str] = []
        self.started = time.monotonic()
        self.finished: float | None = None
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self.thread: threading.Thread | None = None
        # What a source expects to write before it knows the files (the demo import), so other
        # jobs count it against the free disk; and the check a source calls once it knows its size.
        self.reserved_bytes = 0
        self.require_space: Callable[[int], None] = lambda needed: None
        # Files verified in the work directory (`files_dir`) so far, which peers may copy while
        # the job still runs; a file is offered only after its hash matched, never while partial.
        self.files_dir: Path | None = None
        self.offered: dict[str, FileEntry] = {}

    def offer(self, rel: str, entry: FileEntry) -> None:
        """A file is verified in the work directory: peers may copy it from now on."""
        with self.lock:
            self.offered[rel] = entry

    def outstanding(self) -> int:
        """Bytes this job has still to write (conservative: files it could resume count as unwritten)."""
        with self.lock:
            if self.state != "running":
                return 0
            return max(0, max(self.total_bytes, self.reserved_bytes) - self.completed_bytes - self.current_bytes)

    def uncount(self, n: int) -> None:
        """Bytes counted as in progress were thrown away (a corrupted file fetched again)."""
        with self.lock:
            self.current_bytes = max(0, self.current_bytes - n)

    def transferred(self, n: int) -> None:
        """Count `n` bytes received over the network into the current file."""
        with self.lock:
            self.transferred_bytes += n
            self.current_bytes += n
            now = time.monotonic()
            self._samples.append((now, self.transferred_bytes))
            while self._samples and now - self._samples[0][0] > RATE_WINDOW_S:
                self._samples.popleft()

    def file_done(self, size: int, how: str = "downloaded", counted: int | None = None) -> None:
        """A file is verified in the work directory: "downloaded", "reused" (local copy) or "resumed".

        `counted`: the bytes of this file already counted as in progress (several files may be in
        flight at once); None: the only file in flight, so nothing is in progress any more.
        """
        with self.lock:
            self.completed_bytes += size
            self.current_bytes = 0 if counted is None else max(0, self.current_bytes - counted)
            self.files_done += 1
            if how == "reused":
                self.reused_bytes += size
            elif how == "resumed":
                self.resumed_bytes += size

    def finish(self, state: str, error: DownloadError | None = None) -> None:
        """Record the final state (and the error, when it failed)."""
        with self.lock:
            self.state = state
            self.finished = time.monotonic()
            self.current_file = None
            if error is not None:
                self.error, self.error_code, self.mismatched = str(error), error.code, error.files

    def info(self) -> DownloadInfo:
        """A snapshot for the API."""
        with self.lock:
            now = time.monotonic()
            rate = 0.0
            if self.state == "running" and len(self._samples) > 1 and now - self._samples[-1][0] < 1.0:
                (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
                rate = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            return DownloadInfo(
                model_id=self.model_id, source=self.source, state=self.state, total_bytes=self.total_bytes,
                done_bytes=self.completed_bytes + self.current_bytes, transferred_bytes=self.transferred_bytes,
                resumed_bytes=self.resumed_bytes, reused_bytes=self.reused_bytes, rate_bps=round(rate, 1),
                current_file=self.current_file, files_total=self.files_total, files_done=self.files_done,
                error=self.error, error_code=self.error_code, mismatched=list(self.mismatched),
                elapsed_s=round((self.finished or now) - self.started, 3))
