"""What mlx itself says about this node's device: run once in a child process at agent start.

`python -m orchestrator.agent.device_probe` prints one JSON object: mlx's backend (metal, cuda
or cpu), `mx.device_info()` of the default device and mlx's memory limit in that process. A
child, because the agent itself never imports mlx: on CUDA that would create a device context
in the agent that holds GPU memory for the agent's whole life, and an mlx that fails to load
(a backend wheel without its CUDA libraries) must not take the agent down with it.
"""

from __future__ import annotations

import json
import subprocess
import sys

from pydantic import BaseModel

PROBE_TIMEOUT_S = 60.0  # importing mlx's CUDA backend loads cuBLAS, cuDNN...: seconds on a cold disk


class DeviceProbe(BaseModel):
    """mlx's view of the node's default device (None fields: the probe could not tell)."""

    backend: str | None = None  # metal, cuda, cpu; None when mlx does not load
    device_info: dict[str, str | int] = {}
    memory_limit: int | None = None  # mx.get_memory_limit() in a fresh process: mlx's own default
    error: str | None = None  # why mlx did not load, for the report


def probe() -> DeviceProbe:
    """Run this module in a child process and parse its answer (never raises)."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return DeviceProbe(error=f"device probe failed: {exc}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return DeviceProbe(error=f"mlx does not load: {tail}")
    try:
        return DeviceProbe.model_validate_json(lines[-1])
    except ValueError as exc:
        return DeviceProbe(error=f"device probe answered {lines[-1][:200]!r}: {exc}")


def _measure() -> DeviceProbe:
    """In the child: ask mlx."""
    # imported here, not at the top: the agent imports this module, and mlx must stay out of the agent
    import mlx.core as mx

    backend = "metal" if mx.metal.is_available() else "cuda" if mx.cuda.is_available() else "cpu"
    info = {k: v for k, v in mx.device_info().items() if isinstance(v, str | int)}
    return DeviceProbe(backend=backend, device_info=info, memory_limit=int(mx.get_memory_limit()))


if __name__ == "__main__":
    print(json.dumps(_measure().model_dump()))
