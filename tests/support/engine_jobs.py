"""What a test hands a node agent to run engine processes, and the models folder a profiler reads."""

from __future__ import annotations

import secrets
from pathlib import Path

from orchestrator.engine.local_pipeline import write_config

MODEL = "tm"


def cluster_toml(tmp_path: Path, splits: list[tuple[int, int]], ports: list[int]) -> str:
    """The engine's own config writer: coordinator on ports[0], stages after."""
    return write_config(tmp_path / f"c{secrets.token_hex(3)}.toml", "agents", splits, ports).read_text()


def stage_request(config: str, node_id: str, secret: str, lease_s: float = 60, cluster_id: str = "c1") -> dict:
    """An agent's `POST /v1/processes` body for one stage of MODEL."""
    return {"kind": "stage", "cluster_id": cluster_id, "node_id": node_id, "model_id": MODEL, "config": config,
            "secret": secret, "lease_s": lease_s, "threads": 1}


class ModelsFolder:
    """The one method of the agent's inventory a compute profiler uses: a model's directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def model_dir(self, model_id: str) -> Path:
        return self.root / model_id
