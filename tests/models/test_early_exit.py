"""`pipeserve make-draft-model`: the served model's first layers and its head, as a model mlx-lm loads
with every kept tensor byte for byte the source's, the same tokenizer, and the coordinator's draft
model accepts it; bad requests leave nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model

from orchestrator.engine.coordinator.draft_model import DraftModel
from orchestrator.models.early_exit import DraftBuildError, make_early_exit_draft
from tests.support.engine_harness import reference


def test_a_cut_keeps_the_first_layers_and_the_head_byte_for_byte(model_factory, tmp_path):
    source = model_factory(layers=6, tied=False)
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "make-draft-model", str(source),
                          str(tmp_path / "draft"), "--layers", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    draft = tmp_path / "draft"
    assert json.loads((draft / "config.json").read_text())["num_hidden_layers"] == 2
    full, cut = mx.load(str(source / "model.safetensors")), mx.load(str(draft / "model.safetensors"))
    assert set(cut) == {k for k in full if ".layers." not in k or int(k.split(".layers.")[1].split(".")[0]) < 2}
    assert any(k.startswith("lm_head") for k in cut) and all(mx.array_equal(cut[k], full[k]).item() for k in cut)
    model, _ = load_model(draft)
    assert len(model.layers) == 2
    # the coordinator's draft model takes it: the same tokenizer, greedy drafts its own
    prompt = [(i * 37 + 11) % 500 for i in range(20)]
    assert DraftModel(draft, source).draft(1, prompt, 4) == reference(draft, prompt, 4).tokens


@pytest.mark.parametrize("layers", [0, 6, 9])
def test_a_cut_outside_the_model_is_refused_and_writes_nothing(model_factory, tmp_path, layers):
    with pytest.raises(DraftBuildError, match="keeps 1 to 5 of the model's 6 layers"):
        make_early_exit_draft(model_factory(layers=6), tmp_path / "draft", layers)
    assert not (tmp_path / "draft").exists()


def test_an_existing_directory_is_never_overwritten(model_factory, tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "keep.txt").write_text("mine")
    with pytest.raises(DraftBuildError, match="exists"):
        make_early_exit_draft(model_factory(layers=6), tmp_path / "draft", 2)
    assert (tmp_path / "draft" / "keep.txt").read_text() == "mine"
