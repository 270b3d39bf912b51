"""Shared fixtures: a tiny random test model and the SmolLM2 demo model."""

from __future__ import annotations

# The stage processes load OpenBLAS when it is installed; the in-test reference must run
# on the same BLAS for bit-exact comparisons, so load it before anything imports mlx.
from orchestrator.engine import blas

blas.preload()

import hashlib
import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default random test model (4 layers, 64 wide, vocab 512, float32, tied, seed 0)."""
    from orchestrator.models.testmodel import make_test_model

    return make_test_model(tmp_path_factory.mktemp("test-model") / "model")


def _demo_cache_key() -> str:
    """Changes whenever the converter's code or the pinned wheel does, so a cached import
    made by older code is never reused."""
    from orchestrator.models import demo, files, gguf

    digest = hashlib.sha256(demo.WHEEL_SHA256.encode())
    for module in (demo, files, gguf):
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="session")
def demo_model_dir() -> Path:
    """SmolLM2-135M-Instruct in float32, imported once and kept in the pipeserve cache
    (~540 MB) so later test runs reuse it; stale imports from older code are removed."""
    from orchestrator.models.demo import cache_root, import_demo_model

    dtype = "float32"
    root = cache_root()
    path = root / f"demo-model-{dtype}-{_demo_cache_key()}"
    # The import appears by atomic rename, so an existing config.json means a complete copy.
    if not (path / "config.json").is_file():
        import_demo_model(path, dtype=dtype, overwrite=True)
    for stale in root.glob(f"demo-model-{dtype}-*"):
        if stale != path and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return path
