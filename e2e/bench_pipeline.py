#!/usr/bin/env python3
"""`make bench`: the benchmark's entry point; the code is the `e2e.bench` package (see its
docstring for the layout and `e2e/bench/cli.py` for the options)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from e2e.bench.cli import main  # noqa: E402 - needs ROOT on sys.path

if __name__ == "__main__":
    sys.exit(main())
