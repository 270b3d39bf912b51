"""Optional OpenBLAS: the mlx-cpu wheel links the reference BLAS (~4 GFLOP/s float32 GEMM).

Loading OpenBLAS globally before `mlx.core` makes mlx's BLAS calls resolve to it (~100x
faster prefill). Everything works without it, only slower; `PIPESERVE_BLAS=reference`
turns it off (benchmarks compare both).
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
from pathlib import Path

BLAS_ENV = "PIPESERVE_BLAS"


def find_openblas() -> Path | None:
    """The libopenblas shipped by the `cmeel-openblas` wheel, if installed."""
    for key in ("purelib", "platlib"):
        candidate = Path(sysconfig.get_paths()[key]) / "cmeel.prefix" / "lib" / "libopenblas.so.0"
        if candidate.exists():
            return candidate
    return None


def preload(threads: int | None = None, solo_threads: int | None = None) -> str:
    """Load OpenBLAS (if available and wanted) before mlx; returns "openblas" or "reference".

    Must run before `import mlx.core`; afterwards it can no longer change anything.
    """
    if threads:
        # OpenBLAS reads these when it loads; idle workers spin, so keep the count deliberate.
        os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    if solo_threads and solo_threads > (threads or 1):
        # Idle OpenBLAS workers spin 2^28 cycles (~0.1 s) before sleeping: long enough to steal
        # the core from a co-located stage that computes next. 2^22 (~1.5 ms) still bridges the
        # gaps between the GEMMs of one step.
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")
    if os.environ.get(BLAS_ENV, "openblas") == "reference" or "mlx.core" in sys.modules:
        return active()
    path = find_openblas()
    if path is None:
        return "reference"
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:  # e.g. libgfortran.so.5 missing: stay on the reference BLAS
        return "reference"
    return "openblas"


def active() -> str:
    """Which BLAS this process has loaded ("openblas" or "reference"), read from its memory map."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    return "openblas" if "libopenblas" in maps else "reference"


def set_threads(n: int) -> bool:
    """Set OpenBLAS's thread count now (call between MLX evaluations); False without OpenBLAS."""
    path = find_openblas()
    if path is None or active() != "openblas":
        return False
    ctypes.CDLL(str(path)).openblas_set_num_threads(int(n))
    return True
