"""`pipeserve stage` refuses a model the engine cannot serve exactly at start: it exits
non-zero with the support registry's reason on stderr, before serving anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.engine.local_pipeline import write_config
from orchestrator.proc import free_port
from orchestrator.testmodels.families import build_family_model

MODEL_INVALID = 4  # stage_main's exit status for a model it cannot load


def _edit(model: Path, **changes: object) -> None:
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, **changes}))


@pytest.mark.parametrize("change,reason", [
    (dict(model_type="bert"), "model family 'bert' is not verified exact in pipeserve's split engine"),
    (dict(vision_config={"hidden_size": 32}), "llama is a multimodal model; pipeserve serves text-only decoders"),
    (dict(quantization={"group_size": 64, "bits": 7}), "7-bit affine quantization is not supported"),
], ids=["unknown family", "vision-language", "unknown quantization"])
def test_stage_exits_with_the_reason(tmp_path: Path, change: dict, reason: str) -> None:
    model = build_family_model(tmp_path / "model", "llama")
    _edit(model, **change)
    config = write_config(tmp_path / "cluster.toml", "refusal", [(0, 2), (3, 5)], [free_port() for _ in range(3)])
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "stage", "--config", str(config), "--node-id", "stage-0",
         "--model", str(model)],
        env={**os.environ, "PIPESERVE_CLUSTER_SECRET": "s" * 32}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == MODEL_INVALID, proc.stderr
    assert "model.invalid" in proc.stderr and "cannot serve this model exactly" in proc.stderr
    assert reason in proc.stderr
    assert "transport.listening" not in proc.stderr + proc.stdout
