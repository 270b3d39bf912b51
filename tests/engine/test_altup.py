"""Gemma 3n through a split: its AltUp streams, stacked before the batch axis in the model
([streams, B, L, H]), cross each boundary as the NAMED frame's `h` [1, L, streams, H]; its
per-layer inputs (a positional argument) cross as Gemma 4's do; its KV-shared layers stay on the
stage of the layers whose caches they read, and a stage that skips them leaves those caches to
their owners. The comparison with single-process mlx-lm fails when any of that is broken."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from orchestrator.engine.stage import stand_ins
from orchestrator.engine.stage.shard import StageModel
from orchestrator.families import support
from tests.support.engine_harness import assert_same, reference, split_in_process

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 16


def _run(model, bounds):
    return split_in_process([StageModel(model, a, b) for a, b in bounds], PROMPT, TOKENS, prefill_step=16)


def test_the_streams_cross_behind_the_length_axis(family_model):
    model = family_model("gemma3n")
    first, second = StageModel(model, 0, 2), StageModel(model, 2, 6)
    out = first.forward(mx.array([PROMPT[:5]]), first.make_cache())
    assert out.h.shape == (1, 5, 4, 64) and second.hidden_shape == (4, 64)
    assert out.extras["per_layer"].shape == (1, 5, 4, 8)  # the per-layer inputs of layers 2-5


def test_the_comparison_detects_only_the_active_stream_crossing(family_model, monkeypatch):
    model = family_model("gemma3n")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    forward = StageModel.forward

    def active_only(self, x, cache):
        out = forward(self, x, cache)
        if self.last:
            return out
        keep = (mx.arange(4) == 0)[None, None, :, None]
        return type(out)(out.h * keep, out.extras)
    monkeypatch.setattr(StageModel, "forward", active_only)
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, 2), (2, 6)]))


def test_the_comparison_detects_the_model_writing_into_the_stages_output(family_model, monkeypatch):
    """Gemma 3n's code after its loop writes into the streams in place (`h[1:] = ...`): without
    its own handle (stand_ins.Exit), the stage would send what the skipped head made of them."""
    model = family_model("gemma3n")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    monkeypatch.setattr(stand_ins.mx, "stop_gradient", lambda a: a)
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, 1), (1, 6)]))


def test_a_stage_skipping_kv_shared_layers_leaves_their_caches_to_their_owners(family_model, monkeypatch):
    """Layers 4 and 5 read layers 3's and 2's caches: every cache of a first stage that skips them
    all counts the prompt once, and would count it twice if a skipped shared layer moved it."""
    model = family_model("gemma3n")
    assert support.borrowed_cache_layers(json.loads((model / "config.json").read_text())) == {4, 5}
    stage = StageModel(model, 0, 2)
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([PROMPT]), cache).h)
    assert [c.offset for c in cache] == [len(PROMPT)] * 4
    monkeypatch.setattr(support, "borrowed_cache_layers", lambda config: frozenset())
    stage = StageModel(model, 0, 2)
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([PROMPT]), cache).h)
    assert [c.offset for c in cache] != [len(PROMPT)] * 4


def test_the_per_layer_input_is_replaced_where_the_model_passes_it(family_model, monkeypatch):
    """Gemma 3n passes each layer's per-layer input positionally; looked for as a keyword, the
    first stage never sees the ones it must send downstream, and says so."""
    model = family_model("gemma3n")
    monkeypatch.setattr(support, "PER_LAYER_ARG", {})
    with pytest.raises(RuntimeError, match=r"no per-layer input reached layers \[2, 3, 4, 5\]"):
        _run(model, [(0, 2), (2, 6)])
