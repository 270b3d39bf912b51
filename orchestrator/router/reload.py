"""Hot reload: poll the YAML file and apply it when it changes.

Polling (every 0.5 s by default) rather than inotify: it works on every OS and filesystem,
costs one stat() per poll, and sees both in-place edits and atomic replacements. A change is
detected by (inode, mtime_ns, size): an atomic `os.replace` always gets a new inode, so two
writes within one mtime tick are still seen. An invalid file keeps the previous config.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable

from orchestrator.logs import EventLogger
from orchestrator.router.config import ConfigError, RouterConfig, load_config

Signature = tuple[int, int, int]


def signature(path: Path) -> Signature | None:
    """(inode, mtime_ns, size) of the file, or None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class ConfigWatcher:
    """Calls `on_change(config)` for each valid new version, `on_invalid(reason)` otherwise."""

    def __init__(self, path: Path, on_change: Callable[[RouterConfig], None], on_invalid: Callable[[str], None],
                 log: EventLogger, interval: float = 0.5, seen: Signature | None = None) -> None:
        """`seen` is the signature taken just before the running config was read (so a change
        made between that read and this call is still picked up); default: the file now."""
        self.path = Path(path)
        self.interval = interval
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._log = log
        self._seen = seen if seen is not None else signature(self.path)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """Check the file once; returns True when a changed version was handled."""
        before = signature(self.path)
        if before == self._seen:
            return False
        if before is None:
            self._seen = None
            self._on_invalid(f"{self.path}: the file is gone")
            return True
        try:
            config = load_config(self.path)
        except ConfigError as exc:
            if signature(self.path) != before:
                return False  # changed while being read (a non-atomic writer): look again next poll
            self._seen = before
            self._on_invalid(str(exc))
            return True
        if signature(self.path) != before:
            return False
        self._seen = before
        self._on_change(config)
        return True

    def start(self) -> None:
        """Poll in a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self._loop, name="router-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll_once()
            except Exception:  # noqa: BLE001 (a bug in a callback must not end hot reload for good)
                self._log.error("config.reload_failed", exc_info=True, path=self.path)
