"""Optional OpenBLAS: the mlx-cpu wheel links the reference BLAS (~4 GFLOP/s float32 GEMM).

Loading OpenBLAS globally before `mlx.core` makes mlx's BLAS calls resolve to it (~100x
faster prefill). Everything works without it, only slower; `PIPESERVE_BLAS=reference`
turns it off (benchmarks compare both).

A build of OpenBLAS may target one CPU (the `cmeel-openblas` wheel is built for SKYLAKEX, AVX-512):
on a CPU without those instructions its first GEMM is an illegal instruction that kills the process.
So it is loaded only after a child process has run one GEMM with it (`runs_here`).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import sysconfig
from pathlib import Path

from orchestrator import settings

BLAS_ENV = settings.BLAS.name


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
        settings.set_for_libraries("OPENBLAS_NUM_THREADS", str(threads))
    if solo_threads and solo_threads > (threads or 1):
        # Idle OpenBLAS workers spin 2^28 cycles (~0.1 s) before sleeping: long enough to steal
        # the core from a co-located stage that computes next. 2^22 (~1.5 ms) still bridges the
        # gaps between the GEMMs of one step.
        settings.set_for_libraries("OPENBLAS_THREAD_TIMEOUT", "22", keep_existing=True)
    if settings.BLAS.read() == "reference" or "mlx.core" in sys.modules:
        return active()
    path = find_openblas()
    if path is None or not runs_here(path):
        return "reference"
    try:
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    except OSError:  # e.g. libgfortran.so.5 missing: stay on the reference BLAS
        return "reference"
    return "openblas"


# One sgemm through the library's cblas interface, in a child: a build for another CPU dies there
# (SIGILL), not in the caller.
_PROBE = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
a = (ctypes.c_float * 4)(1, 2, 3, 4)
c = (ctypes.c_float * 4)()
lib.cblas_sgemm(101, 111, 111, 2, 2, 2, ctypes.c_float(1), a, 2, a, 2, ctypes.c_float(0), c, 2)
sys.exit(0 if list(c) == [7.0, 10.0, 15.0, 22.0] else 3)
"""


def runs_here(path: Path) -> bool:
    """Whether this OpenBLAS computes a GEMM on this CPU (checked in a child process)."""
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, str(path)],
                              capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


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
