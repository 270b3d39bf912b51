"""Kimi-K3's attention residuals through a split: each layer mixes the outputs of every block of
layers so far into its input, so every boundary carries those blocks beside the hidden state
(engine/stage/carry.py `AttentionResiduals`), and the comparison with single-process mlx-lm fails
when they do not all arrive."""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.stage import carry
from orchestrator.engine.stage.shard import StageModel
from orchestrator.families import support
from tests.support.engine_harness import assert_same, reference, split_in_process

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 16


def _run(model, bounds):
    return split_in_process([StageModel(model, a, b) for a, b in bounds], PROMPT, TOKENS, prefill_step=16)


def test_every_boundary_carries_the_blocks_begun_before_it(family_model):
    """Blocks of two layers begin at 0, 2 and 4: a boundary at 1 or 2 carries one, at 3 or 4 two,
    at 5 three ([B, L, blocks, hidden] in the NAMED frame)."""
    model = family_model("kimi_k3")
    cfg = json.loads((model / "config.json").read_text())
    assert "text_config" in cfg and "vision_config" in cfg  # the published layout
    assert [support.handed_on(cfg, b)["attn_res_blocks"][0] for b in range(1, 6)] == [1, 1, 2, 2, 3]
    assert StageModel(model, 5, 6).extras_in == {"attn_res_blocks": (3, 64)}
    assert StageModel(model, 0, 6).extras_in == {}


def test_a_split_inside_a_block_and_at_its_start_equals_mlx_lm(family_model):
    model = family_model("kimi_k3")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    assert_same(expected, _run(model, [(0, 1), (1, 4), (4, 5), (5, 6)]))


def test_the_comparison_detects_a_boundary_carrying_only_the_newest_block(family_model, monkeypatch):
    """A stage that received only the last block (as if the boundary carried one residual
    stream) must fail."""
    model = family_model("kimi_k3")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    from_wire = carry.AttentionResiduals.from_wire
    monkeypatch.setattr(carry.AttentionResiduals, "from_wire", lambda self, t: from_wire(self, t[:, :, -1:, :]))
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, 3), (3, 6)]))
