"""Optional OpenBLAS: the mlx-cpu wheel links the reference BLAS (~4 GFLOP/s float32 GEMM).

Loading OpenBLAS globally before `mlx.core` makes mlx's BLAS calls resolve to it (~100x
faster prefill). Everything works without it, only slower; `PIPESERVE_BLAS=reference`
turns it off (benchmarks compare both).

A build of OpenBLAS may target one CPU (the `cmeel-openblas` wheel is built for SKYLAKEX, AVX-512):
on a CPU without those instructions its first GEMM is an illegal instruction that kills the process.
So each candidate is loaded only after a child process has run one GEMM with it (`runs_here`), and
where the wheel's cannot run (an AMD EPYC with AVX2 only: prefill of 100 tokens on SmolLM2 took 19 s
on the reference BLAS), the system's OpenBLAS is next: Debian's `libopenblas0-pthread` picks its
kernels for the CPU it runs on (0.7 s there).
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import sysconfig
from pathlib import Path

from orchestrator import settings

BLAS_ENV = settings.BLAS.name


# Debian's OpenBLAS (libopenblas0-pthread), built for every CPU of its architecture.
SYSTEM_OPENBLAS = tuple(Path(f"/usr/lib/{arch}-linux-gnu/openblas-pthread/libopenblas.so.0")
                        for arch in ("x86_64", "aarch64"))


def candidates() -> list[Path]:
    """The OpenBLAS libraries installed here, best first: the `cmeel-openblas` wheel's, the system's."""
    found = []
    for key in ("purelib", "platlib"):
        wheel = Path(sysconfig.get_paths()[key]) / "cmeel.prefix" / "lib" / "libopenblas.so.0"
        if wheel.exists() and wheel not in found:
            found.append(wheel)
    return found + [p for p in SYSTEM_OPENBLAS if p.exists()]


def find_openblas() -> Path | None:
    """The first installed OpenBLAS that computes on this CPU (each is probed in a child process)."""
    return next((p for p in candidates() if runs_here(p)), None)


def loaded() -> Path | None:
    """The OpenBLAS this process has loaded, read from its memory map (None: the reference BLAS)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        if "libopenblas" in line and "/" in line:
            return Path(line[line.index("/"):].strip())
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
    if path is None:
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
    if not Path("/proc/self/maps").exists():
        return "unknown"
    return "reference" if loaded() is None else "openblas"


def set_threads(n: int) -> bool:
    """Set OpenBLAS's thread count now (call between MLX evaluations); False without OpenBLAS."""
    path = loaded()
    if path is None:
        return False
    ctypes.CDLL(str(path)).openblas_set_num_threads(int(n))
    return True
