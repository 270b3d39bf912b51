"""The one atomic writer: owner-only by default, all or nothing, no temporary file left behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orchestrator.atomic_write import write_atomically


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_owner_only_and_complete(tmp_path: Path) -> None:
    target = tmp_path / "secrets.json"
    write_atomically(target, '{"a": 1}')
    assert target.read_text() == '{"a": 1}' and _mode(target) == 0o600
    write_atomically(target, b"second")
    assert target.read_bytes() == b"second" and _mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secrets.json"]


def test_a_shared_file_keeps_the_mode_asked_for(tmp_path: Path) -> None:
    target = tmp_path / "router.yaml"
    write_atomically(target, "backends: []\n", mode=0o644, durable_rename=True)
    assert _mode(target) == 0o644 and target.read_text() == "backends: []\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)  # the disk filling up at the last step
    with pytest.raises(OSError, match="No space"):
        write_atomically(target, "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
