#!/usr/bin/env python3
"""`make bench`: 2 emulated nodes (one core each) against one node, with mlx-lm's peers in the same
run; the code is `e2e.bench.nodes_cli` (options) and `e2e.bench.nodes` (the method)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e.bench.nodes_cli import main  # noqa: E402 - needs ROOT on sys.path

if __name__ == "__main__":
    sys.exit(main())
