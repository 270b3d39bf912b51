"""File helpers for tests that check what landed on disk, independently of the agent's code."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256sums(model_dir: Path) -> dict[str, str]:
    """hashlib over the files on disk, by relative path."""
    return {p.relative_to(model_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(model_dir.rglob("*")) if p.is_file()}
