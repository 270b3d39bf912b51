"""The last stage builds llguidance's tokenizer at start, for the end-of-sequence ids the coordinator's
tokenizer has: its build holds Python's lock (seconds on a loaded machine), and on the first
constrained request it kept the stage's readers from answering the coordinator's pings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mlx_lm.tokenizer_utils import load as load_tokenizer

from orchestrator.engine.stage.constraint import model_eos_ids


def test_the_stage_reads_the_eos_ids_the_coordinators_tokenizer_has(test_model_dir, demo_model_dir, tmp_path):
    for model in (test_model_dir, demo_model_dir):
        assert model_eos_ids(model) == sorted(load_tokenizer(model).eos_token_ids), model
    # an entry in special_tokens_map.json, as a dict (older checkpoints)
    copy = Path(shutil.copytree(test_model_dir, tmp_path / "m"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    (copy / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": config.pop("eos_token")}}))
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert model_eos_ids(copy) == model_eos_ids(test_model_dir)
    (copy / "special_tokens_map.json").write_text("{}")
    assert model_eos_ids(copy) == []  # the files do not say: built on first use, as before


def test_the_last_stage_prepares_grammars_before_it_listens(test_model_dir, launch):
    cluster = launch(test_model_dir, [(0, 1), (2, 3)])
    last, first = cluster.output("stage-1", 200), cluster.output("stage-0", 200)
    assert "grammars.prepared" in last and "grammars.prepared" not in first
    assert last.index("grammars.prepared") < last.index("transport.listening")
