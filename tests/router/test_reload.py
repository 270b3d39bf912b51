"""Hot reload detection (in-process; the router-process behaviour is in test_router.py)."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator import logs
from orchestrator.router.config import RouterConfig
from orchestrator.router.reload import ConfigWatcher, signature

V1 = "backends: [{name: a, url: 'http://127.0.0.1:1'}]\n"
V2 = "backends: [{name: b, url: 'http://127.0.0.1:1'}]\n"  # same size as V1


def _watcher(path: Path) -> tuple[ConfigWatcher, list[RouterConfig], list[str]]:
    applied: list[RouterConfig] = []
    rejected: list[str] = []
    return ConfigWatcher(path, applied.append, rejected.append, logs.get("test")), applied, rejected


def test_changes_are_applied_and_invalid_versions_rejected_once(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(V1)
    w, applied, rejected = _watcher(path)
    assert not w.poll_once() and not applied  # the version it started with is not "new"

    path.write_text("backends: [{name: a}]\n")  # url missing
    assert w.poll_once()
    assert not w.poll_once()  # the same broken version is reported once, not every poll
    assert len(rejected) == 1 and "backends.0.url" in rejected[0] and not applied

    tmp = tmp_path / "next.yaml"
    tmp.write_text(V2)
    os.replace(tmp, path)
    assert w.poll_once()
    assert [b.name for b in applied[-1].backends] == ["b"]


def test_an_atomic_replace_with_equal_size_and_mtime_is_seen(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(V1)
    w, applied, _ = _watcher(path)
    st = path.stat()
    tmp = tmp_path / "next.yaml"
    tmp.write_text(V2)
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # same mtime and size: only the inode differs
    os.replace(tmp, path)
    assert w.poll_once()
    assert [b.name for b in applied[-1].backends] == ["b"]


def test_a_change_made_before_the_watcher_started_is_not_lost(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(V1)
    seen = signature(path)  # what the router had when it loaded
    tmp = tmp_path / "next.yaml"
    tmp.write_text(V2)
    os.replace(tmp, path)
    applied: list[RouterConfig] = []
    w = ConfigWatcher(path, applied.append, lambda reason: None, logs.get("test"), seen=seen)
    assert w.poll_once() and applied


def test_a_removed_file_is_reported_and_its_return_applied(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(V1)
    w, applied, rejected = _watcher(path)
    path.unlink()
    assert w.poll_once() and "gone" in rejected[-1]
    path.write_text(V2)
    assert w.poll_once() and [b.name for b in applied[-1].backends] == ["b"]
