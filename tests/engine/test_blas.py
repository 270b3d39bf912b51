"""OpenBLAS is loaded only where it computes: a build for another CPU must not kill the process."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from orchestrator.engine import blas


def reference_blas() -> Path:
    """The reference BLAS the mlx-cpu wheel ships (exports cblas_sgemm, runs on any x86-64)."""
    libs = sorted(Path(mx.__file__).parents[1].glob("mlx*.libs/libblas*.so*"))
    assert libs, "the mlx-cpu wheel's libblas"
    return libs[0]


def test_a_blas_that_computes_here_passes_the_probe():
    assert blas.runs_here(reference_blas())


def test_a_library_that_cannot_compute_is_refused(tmp_path):
    not_a_library = tmp_path / "libopenblas.so.0"
    not_a_library.write_bytes(b"\x7fELF but not really")
    assert not blas.runs_here(not_a_library)
    assert not blas.runs_here(tmp_path / "missing.so")


def test_the_openblas_found_is_one_that_computes_here():
    found = blas.find_openblas()
    runnable = [p for p in blas.candidates() if blas.runs_here(p)]
    assert found == (runnable[0] if runnable else None)


def test_the_system_openblas_is_a_candidate_where_installed():
    # Debian's build picks its kernels at run time: the fallback where the wheel's needs AVX-512
    installed = [p for p in blas.SYSTEM_OPENBLAS if p.exists()]
    assert [p for p in blas.candidates() if p in blas.SYSTEM_OPENBLAS] == installed
    for p in installed:
        assert blas.runs_here(p)


def test_the_loaded_library_is_what_active_reports():
    assert (blas.loaded() is not None) == (blas.active() == "openblas")


def test_this_process_loaded_openblas_only_if_it_runs_here():
    path = blas.find_openblas()
    if path is None:
        assert blas.active() == "reference"
    else:  # tests/conftest.py preloaded it, or not, by the same probe
        assert (blas.active() == "openblas") == (blas.runs_here(path) and blas.settings.BLAS.read() != "reference")
