"""Router fixtures: real `pipeserve router` processes and real coordinators, on free ports.

A fixture that cannot get its process up fails at once with that process's own output,
instead of letting a test time out on a connection error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.engine.local_pipeline import LocalPipeline


@pytest.fixture(scope="session")
def coordinators(test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalPipeline]]:
    """Two independent one-stage pipelines of the same test model, both serving model "shared".

    Started in parallel (each start is mostly a child importing mlx-lm) and shared by the
    router tests, which measure traffic as differences of the coordinators' counters.
    """
    root = tmp_path_factory.mktemp("coordinators")
    pipelines = [LocalPipeline(root / f"c{i}", test_model_dir, [(0, 3)], threads=1, model_name="shared")
                 for i in range(2)]
    errors: list[BaseException] = []

    def start(p: LocalPipeline) -> None:
        try:
            p.start()
        except BaseException as exc:  # noqa: BLE001 (reported below, with the child's output)
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in pipelines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            pytest.fail(f"could not start the coordinators: {errors[0]}")
        yield pipelines
    finally:
        for p in pipelines:
            p.stop()
