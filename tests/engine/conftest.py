"""Engine fixtures: local pipelines that always get stopped (cached random models: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from orchestrator.engine.local_pipeline import LocalPipeline


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """`family_model(name, dtype="float32", quant=None)` builds each family's test model once per
    variant, for every module of the matrix (the directory is named after the family)."""
    from orchestrator.testmodels.families import build_family_model

    root = tmp_path_factory.mktemp("families")
    made: dict[tuple, Path] = {}

    def make(name: str, dtype: str = "float32", quant: str | None = None) -> Path:
        key = (name, dtype, quant)
        if key not in made:
            made[key] = build_family_model(root / f"{dtype}-{quant or 'plain'}" / name, name, dtype=dtype,
                                           quant=quant)
        return made[key]

    return make


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., LocalPipeline]]:
    """`launch(model_dir, splits, coordinator=True, env=None, startup_timeout=120, **cluster)` starts a
    local pipeline, stopped after the test."""
    started: list[LocalPipeline] = []

    def start(model_dir: Path, splits: list[tuple[int, int]], coordinator: bool = True,
              env: dict[str, str] | None = None, startup_timeout: float = 120.0, **cluster: object) -> LocalPipeline:
        p = LocalPipeline(tmp_path / f"cluster{len(started)}", model_dir, splits, coordinator=coordinator,
                          threads=1, env=env or {}, cluster=cluster, startup_timeout=startup_timeout)
        started.append(p)
        return p.start()

    yield start
    for p in started:
        p.stop()
