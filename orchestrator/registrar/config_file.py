"""Register backends by editing the router's YAML file (continuum-router hot-reloads it).

Every change is a read-modify-write of the whole file under a lock, written atomically: a
temporary file in the same directory, fsync'ed, then `os.replace` over the original and an
fsync of the directory. A router polling the file therefore sees the old or the new
version, never half of one. Only the `backends:` list changes, and only the named entry in
it: every other key and every other backend keep their values and order.

Limitation: PyYAML does not keep comments, so a rewrite drops comments in the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Any, Iterator

import yaml

from orchestrator.atomic_write import write_atomically
from orchestrator.registrar.base import BackendEntry, Registrar, RegistrarError, entry_from_dict, validated_entry


class ConfigFileRegistrar(Registrar):
    """Edits the `backends:` list of a continuum-router / `pipeserve router` YAML file.

    Serialized twice: a thread lock for this object, and `flock` on a sidecar
    `<file>.lock`, which also excludes other registrar objects and other processes
    (flock locks belong to the open file, so two opens in one process exclude each other).
    """

    def __init__(self, path: Path | str, router_url: str | None = None) -> None:
        """`router_url`: the router that reads this file, asked whether it routes to an entry."""
        self.path = Path(path)
        self.router_url = router_url
        self._lock = threading.Lock()

    def register(self, name: str, url: str, models: list[str] | tuple[str, ...], weight: int = 1) -> None:
        """Add or replace the backend `name` (in place, keeping its position)."""
        entry = validated_entry(name, url, models, weight).as_dict()
        with self._locked():
            doc = self._read()
            backends = doc.get("backends") or []
            positions = [i for i, b in enumerate(backends) if isinstance(b, dict) and b.get("name") == name]
            if len(positions) == 1 and backends[positions[0]] == entry:
                return  # already registered exactly so: no write, no reload
            if positions:
                backends[positions[0]] = entry
                for i in reversed(positions[1:]):  # a hand-made duplicate collapses into one
                    del backends[i]
            else:
                backends.append(entry)
            doc["backends"] = backends
            self._write(doc)

    def deregister(self, name: str) -> None:
        """Remove every entry named `name`; no write when there is none."""
        with self._locked():
            doc = self._read()
            backends = doc.get("backends") or []
            kept = [b for b in backends if not (isinstance(b, dict) and b.get("name") == name)]
            if len(kept) == len(backends):
                return
            doc["backends"] = kept
            self._write(doc)

    def backends(self) -> list[BackendEntry]:
        """The backends listed in the file now."""
        with self._locked():
            doc = self._read()
        return [e for e in (entry_from_dict(b) for b in doc.get("backends") or []) if e is not None]

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    def _read(self) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as exc:
            raise RegistrarError(f"{self.path}: cannot read: {exc}") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            # Never overwrite a file we cannot parse: that would lose the operator's config.
            raise RegistrarError(f"{self.path}: not valid YAML, left untouched: {exc}") from None
        if doc is None:
            return {}
        if not isinstance(doc, dict):
            raise RegistrarError(f"{self.path}: the top level is not a mapping, left untouched")
        if not isinstance(doc.get("backends") or [], list):
            raise RegistrarError(f"{self.path}: `backends` is not a list, left untouched")
        return doc

    def _write(self, doc: dict[str, Any]) -> None:
        text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=True)
        try:
            mode = self.path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o644
        try:
            # durable: the rename itself must reach the disk, or a crash could bring the old file back
            write_atomically(self.path, text, mode=mode, durable_rename=True)
        except OSError as exc:
            raise RegistrarError(f"{self.path}: cannot write: {exc}") from None
