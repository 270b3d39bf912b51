"""The model's layers timed on this machine as an agent times them (engine/profiling/layers.py, in a
process of its own), with the busy-machine rule's doubt: what the planner predicts from. Shared by
the LAN benchmark and `make bench`'s prediction row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.agent.timing_doubt import profile_doubt
from orchestrator.planner.perf_inputs import LayerTiming

ROOT = Path(__file__).resolve().parents[2]


def time_layers(model: Path, env: dict[str, str], cores: set[int] | None = None) -> tuple[LayerTiming, str]:
    """The model's layers timed by the profiler in a child with `env` (pinned to `cores` when given),
    and the doubt about them ('' when the timing is trusted)."""
    load = os.getloadavg()[0]

    def pinned() -> None:
        if cores:
            os.sched_setaffinity(0, cores)  # its threads inherit it: BLAS and MLX threads made at import

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        res = subprocess.run([sys.executable, "-m", "orchestrator.engine.profiling.layers", "--model", str(model),
                              "--out", str(out)], env=env, cwd=ROOT, preexec_fn=pinned,
                             capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"timing the layers of {model} failed:\n{res.stderr[-3000:]}")
        data = json.loads(out.read_text())
    doubt = profile_doubt({**data, "load": load, "cpus": os.cpu_count() or 0})
    return LayerTiming(**{k: v for k, v in data.items() if k not in ("threads", "at", "spread")}), doubt
