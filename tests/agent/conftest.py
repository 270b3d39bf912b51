"""Agent test fixtures (the agent processes themselves: tests/support/agents.py and the root conftest).

A fixture that cannot get its agent up fails at once with the agent's own output, instead
of letting a test time out on a connection error.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def transfer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~19 MB two-shard test model: big enough that a throttled copy can be interrupted."""
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("transfer") / "model", layers=8, hidden=256, shards=2)


def copy_model(src: Path, dst_models_dir: Path, model_id: str) -> Path:
    """Put a model on an agent's disk (the node that 'downloaded it first')."""
    import shutil

    return Path(shutil.copytree(src, dst_models_dir / model_id))
