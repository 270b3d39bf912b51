"""The exactness matrix: every family the engine claims, split, equals single-process mlx-lm.

Models come from mlx-lm's own classes with random weights (orchestrator/testmodels/families.py):
sliding windows of 8 tokens under a 40-token prompt, sliding/global patterns of period 2-3,
dense-then-MoE stacks, hybrid linear-attention / SSM layers. Splits cut after the first
layer, in the middle and three ways; prefill is chunked (16 tokens). The comparison is
`assert_same` (tokens identical, float32 log-probs bit-identical), and each mechanism the
stage relies on is broken once on purpose to show the comparison catches it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from orchestrator.engine.stage import stand_ins as stubs
from orchestrator.engine.stage.shard import ShardError, StageModel
from orchestrator.families import support
from orchestrator.testmodels.families import FAMILIES
from tests.support import matrix
from tests.support.engine_harness import InTestCoordinator, assert_same, reference, split_in_process

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 16
CHUNK = 16
NAMES = sorted(FAMILIES)
MOE = {name for name, spec in FAMILIES.items() if spec.moe}


# Gemma 4's KV-shared layers (4, 5) stay with their sources (2, 3): boundaries 3-5 are refused
# (test_a_boundary_between_kv_shared_layers_is_refused), so its splits cut at 1 and 2, across
# which the per-layer inputs of every later layer travel.
_GEMMA4_SPLITS = [[(0, 1), (1, 6)], [(0, 2), (2, 6)], [(0, 1), (1, 2), (2, 6)]]
# AFM's KV-reuse layers (4, 5) attend over layer 3's K/V: boundaries 4 and 5 are refused
# (test_a_boundary_before_afm7_kv_reuse_layers_is_refused); its splits cut at 1, 2 and 3.
SPLITS = {"gemma4_text": _GEMMA4_SPLITS, "gemma4": _GEMMA4_SPLITS, "gemma3n": _GEMMA4_SPLITS,
          "afm7": [[(0, 1), (1, 6)], [(0, 3), (3, 6)], [(0, 1), (1, 3), (3, 6)]]}


def splits(layers: int, family: str | None = None) -> list[list[tuple[int, int]]]:
    """Half-open layer ranges: after the first layer, in the middle, and three ways."""
    if family in SPLITS:
        return SPLITS[family]
    return [[(0, 1), (1, layers)], [(0, layers // 2), (layers // 2, layers)],
            [(0, 2), (2, layers - 1), (layers - 1, layers)]]


def run_split(model_dir: Path, bounds: list[tuple[int, int]], stage=StageModel):
    return split_in_process([stage(model_dir, a, b) for a, b in bounds], PROMPT, TOKENS, prefill_step=CHUNK)


def test_every_claimed_family_has_a_matrix_row():
    """The registry claims no family the matrix does not build and compare."""
    built = {support.family_of({"model_type": spec.model_type}) for spec in FAMILIES.values()}
    assert set(support.FAMILIES) <= built, f"claimed without a test model: {set(support.FAMILIES) - built}"


@pytest.mark.parametrize("family", NAMES)
def test_split_equals_mlx_lm(family_model, family):
    model = family_model(family)
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    assert len(set(expected.tokens)) >= 4, "the test model must not repeat one token"
    for bounds in splits(len(FAMILIES[family].layers), family):
        assert_same(expected, run_split(model, bounds))


# Every family in one quantization (q4 or mixed, alternating: tests/support/matrix.py), a third of the
# dense ones in bfloat16 (CPU GatherMM is float32-only), and the formats mlx-community publishes for some.
@pytest.mark.parametrize("family,dtype,quant", [
    *[(name, "float32", quant) for name, quant in matrix.rows(NAMES, ["q4", "mixed"], every=("llama", "qwen3_moe"))
      if quant in FAMILIES[name].quants],  # afm7: float only (mlx-lm cannot quantize it)
    *[(name, "bfloat16", None) for name in matrix.sample([n for n in NAMES if n not in MOE], stride=3)],
    ("llama", "float16", None), ("qwen3", "float32", "q6"), ("gemma3_text", "float32", "q8"),
    ("gpt_oss", "float32", "mxfp4"), ("qwen3_moe", "float32", "mxfp4"), ("deepseek_v41", "float32", "mixed"),
])
def test_formats_split_equal_mlx_lm(family_model, family, dtype, quant):
    model = family_model(family, dtype, quant)
    layers = len(FAMILIES[family].layers)
    assert_same(reference(model, PROMPT, TOKENS, prefill_step=CHUNK), run_split(model, splits(layers, family)[2]))


def test_batched_decode_is_bit_identical_for_every_family(tmp_path):
    """Under the reference BLAS a micro-batched decode step equals each request's solo step bit
    for bit (the stage's batching, not the BLAS, is what this checks), and every family's
    decode steps really run batched (gemma2 and MLA through support.ROW_ATTENTION)."""
    env = {**os.environ, "PIPESERVE_BLAS": "reference"}
    out = subprocess.run([sys.executable, "-m", "tests.support.batch_check", str(tmp_path), *NAMES],
                         capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["family"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(results) == set(NAMES)
    assert all(r["blas"] == "reference" for r in results.values())
    wrong = {f: r for f, r in results.items() if not r["exact"]}
    assert not wrong, f"batched rows differ from solo steps: {wrong}"
    unbatched = {f: r["refusal"] for f, r in results.items() if not r["batched"]}
    known = {f for f in NAMES if support.family_of({"model_type": FAMILIES[f].model_type}) in support.UNBATCHED}
    assert set(unbatched) == known, f"decode steps fell back to one request at a time: {unbatched}"


@pytest.mark.slow
# gemma4_text, hunyuan, rwkv7, talkie, kimi_k3, deepseek_v41: NAMED frames (per-layer inputs, handed-on K/V,
# v_first, the normalised embedding, attention residuals, residual streams with compressed K/V, top-k picks
# and candidate flags) between real processes
@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "deepseek_v3", "qwen3_next", "nemotron_h", "jamba",
                                    "gemma4_text", "hunyuan", "rwkv7", "talkie", "kimi_k3", "deepseek_v41",
                                    "gemma3n"])
def test_real_stages_serve_concurrent_requests_like_solo_runs(family_model, launch, family):
    """Real stage processes over TCP; three requests at once, each with its solo tokens."""
    model = family_model(family)
    layers = len(FAMILIES[family].layers)
    prompts = [PROMPT, PROMPT[:9], PROMPT[5:30]]
    expected = [reference(model, p, 12, prefill_step=2048) for p in prompts]
    three = [(0, 0), (1, layers // 2), (layers // 2 + 1, layers - 1)]
    if family in SPLITS:  # the cuts this family allows (gemma4_text: not between K/V-sharing layers)
        three = [(a, b - 1) for a, b in next(s for s in SPLITS[family] if len(s) == 3)]
    cluster = launch(model, three, coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        assert_same(expected[0], coord.run(prompts[0], 12))  # alone: bit for bit
        gens = [coord.generate(p, 12) for p in prompts]
        for exp, gen in zip(expected, gens):
            got = coord.collect(gen)
            assert got.tokens == exp.tokens, f"a concurrent request's tokens differ: {got.tokens} vs {exp.tokens}"
    finally:
        coord.stop()


# --- the comparison bites: each mechanism, broken once ---------------------------------

class _UnscaledEmbedding(StageModel):
    """Gemma multiplies the embedding by sqrt(hidden) in its own __call__; undo it."""

    def forward(self, x, cache):
        if self.first:
            inner = self._model.model
            embed = inner.embed_tokens
            scale = inner.args.hidden_size ** 0.5
            inner.embed_tokens = _Scaled(embed, 1 / scale)
            try:
                return super().forward(x, cache)
            finally:
                inner.embed_tokens = embed
        return super().forward(x, cache)


class _Scaled(nn.Module):
    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner, self.factor = inner, factor

    def __call__(self, x):
        return self.inner(x) * self.factor

    def as_linear(self, x):
        return self.inner.as_linear(x)


class _PlainCaches(StageModel):
    """Every layer gets a plain KVCache: sliding layers lose their window."""

    def make_cache(self):
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in super().make_cache()]


class _NoSoftCap(StageModel):
    """The last stage's logits skip the family's final soft-capping."""

    def __init__(self, *args):
        super().__init__(*args)
        self._model.final_logit_softcapping = 1e30


@pytest.mark.parametrize("family,broken", [
    ("gemma3_text", _UnscaledEmbedding), ("gemma3_text", _PlainCaches), ("gpt_oss", _PlainCaches),
    ("gemma2", _NoSoftCap),
])
def test_the_comparison_detects_a_broken_mechanism(family_model, family, broken):
    model = family_model(family)
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    bounds = splits(len(FAMILIES[family].layers))[1]
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, bounds, stage=broken))
    assert_same(expected, run_split(model, bounds))  # the same runner, unbroken, passes


def test_the_comparison_detects_skipped_layers_not_counting_positions(family_model, monkeypatch):
    """gpt_oss builds its sliding mask from layer 0's cache and its global mask from layer 1's:
    a stage that skips those layers must still see their offsets move (without, its masks no
    longer fit its keys: wrong output or a shape error, never a pass)."""
    model = family_model("gpt_oss")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    monkeypatch.setattr(stubs, "_advance", lambda cache, length, batch: None)
    with pytest.raises((AssertionError, ValueError)):
        assert_same(expected, run_split(model, [(0, 2), (2, 4)]))


def test_the_comparison_detects_stand_ins_failing_the_family_isinstance_checks(family_model, monkeypatch):
    """OLMo-hybrid picks each layer's mask by the layer's class: stand-ins that did not pass
    its isinstance checks would hand a full-attention layer the linear layers' mask."""
    from orchestrator.engine.stage import shard
    def plain(cls):
        return type(f"Plain{cls.__name__}", (cls,), {"__class__": property(lambda self: type(self))})

    model = family_model("olmo_hybrid")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    bounds = splits(len(FAMILIES["olmo_hybrid"].layers))[2]
    assert_same(expected, run_split(model, bounds))
    for name in ("Skip", "Entry", "Exit"):
        monkeypatch.setattr(shard, name, plain(getattr(stubs, name)))
    with pytest.raises((AssertionError, ValueError)):
        assert_same(expected, run_split(model, bounds))


def test_a_vision_tower_in_the_weights_is_never_loaded(family_model):
    """The published checkpoint carries its vision tower (NaN-filled here): no stage holds it."""
    model = family_model("qwen3_vl")
    saved = mx.load(str(model / "model.safetensors"))
    tower = [k for k in saved if k.startswith("visual.")]
    assert tower and all(mx.isnan(saved[k]).all().item() for k in tower)
    for a, b in splits(len(FAMILIES["qwen3_vl"].layers))[2]:
        held = {k for k, _ in nn.utils.tree_flatten(StageModel(model, a, b)._model.parameters())}
        assert not any("visual" in k for k in held)


# --- refusals ---------------------------------------------------------------------------

def test_a_stage_refuses_an_unsupported_family(family_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(family_model("llama"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "iquestloopcoder"}))
    with pytest.raises(ShardError, match="iquestloopcoder.*missing: a step that crosses every stage boundary"):
        StageModel(model, 0, 2)


def test_a_stage_refuses_a_vision_language_model(family_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(family_model("gemma3_text"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vision_config": {"hidden_size": 8}}))
    with pytest.raises(ShardError, match="multimodal"):
        StageModel(model, 0, 2)


def test_hidden_states_cross_in_the_dtype_the_layer_produced(family_model):
    """A bfloat16 model's stage hands on bfloat16 (the wire carries what the layer made)."""
    model = family_model("qwen3", "bfloat16")
    first = StageModel(model, 0, 3)
    h = first.forward(mx.array(PROMPT[:5])[None], first.make_cache())
    assert h.dtype == mx.bfloat16 and h.shape == (1, 5, 64)


@pytest.mark.parametrize("family", ["gemma4_text", "gemma4"])
def test_a_boundary_between_kv_shared_layers_is_refused(family_model, family):
    """Gemma 4's layer 4 reuses layer 3's K/V and layer 5 layer 2's (the whole cache): a stage
    may not start at 3, 4 or 5, and says which layers must share a stage; 1 and 2 are served."""
    model = family_model(family)
    cuts = support.shared_kv_cuts(json.loads((model / "config.json").read_text()))
    assert sorted(cuts) == [3, 4, 5]
    for b in (3, 4, 5):
        for a, z in ((0, b), (b, 6)):
            with pytest.raises(ShardError, match=f"boundary before layer {b} separates KV-shared layer"):
                StageModel(model, a, z)
    assert "layers 3-4 must share a stage" in cuts[4]


def test_a_boundary_before_afm7_kv_reuse_layers_is_refused(family_model):
    """AFM's KV-reuse layers 4 and 5 (its second layer list) attend over layer 3's K/V: a stage
    may not start at 4 or 5, and says which layers must share a stage; 1, 2 and 3 are served."""
    model = family_model("afm7")
    cuts = support.shared_kv_cuts(json.loads((model / "config.json").read_text()))
    assert sorted(cuts) == [4, 5]
    for b in (4, 5):
        for a, z in ((0, b), (b, 6)):
            with pytest.raises(ShardError, match=f"boundary before layer {b} separates KV-reuse layer {b} from "
                                                 "layer 3.*layers 3-5 must share a stage"):
                StageModel(model, a, z)
    stages = [StageModel(model, a, b) for a, b in ((0, 1), (1, 3), (3, 6))]
    assert [type(layer).__name__ for layer in stages[2]._model.layers] == [
        "Skip", "Skip", "Skip", "Checkpoint", "Checkpoint", "Checkpoint"]  # one index over both lists
    assert len(stages[0].make_cache()) == 4  # the KV-reuse layers keep no cache


def test_the_comparison_detects_afm7_kv_reuse_layers_reading_another_layers_kv(family_model, monkeypatch):
    """AFM's KV-reuse layers must attend over layer 3's K/V: handing them layer 2's instead (the
    cache before the last, on the stage that runs both) must fail."""
    model = family_model("afm7")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    bounds = [(0, 1), (1, 6)]
    assert_same(expected, run_split(model, bounds))

    class _Shifted(StageModel):
        def forward(self, x, cache):
            if self.last:
                cache = [*cache[:-1], _KVOf(cache[-1], cache[-2])]
            return super().forward(x, cache)

    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, bounds, stage=_Shifted))


class _KVOf:
    """A cache that is `own` in everything but the K/V it gives the model's code after its layers."""

    def __init__(self, own, other) -> None:
        self.own, self.other = own, other

    def keys_and_values(self):
        return self.other.keys_and_values()

    def __getattr__(self, key):
        return getattr(self.__dict__["own"], key)


def test_the_comparison_detects_per_layer_inputs_not_crossing(family_model, monkeypatch):
    """Beyond the first stage Gemma 4's per-layer embedding is hollow: a stage that ran its layers
    on what it computed itself (zeros) instead of the received per-layer inputs must fail."""
    from orchestrator.engine.stage import carry

    model = family_model("gemma4_text")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    monkeypatch.setattr(carry.PerLayerFeed, "begin", lambda self, incoming: setattr(self, "taken", {}))
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, [(0, 2), (2, 6)]))


def test_the_comparison_detects_per_layer_inputs_shifted_by_one_layer(family_model, monkeypatch):
    """Each layer must get its own slice: feeding layer i the slice of layer i+1 fails."""
    from orchestrator.engine.stage import carry

    model = family_model("gemma4_text")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    given = carry.PerLayerFeed.given

    def shifted(self, index, computed):
        return given(self, index if self.incoming is None else min(index + 1, self.n - 1), computed)

    monkeypatch.setattr(carry.PerLayerFeed, "given", shifted)
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, [(0, 1), (1, 6)]))


@pytest.mark.parametrize("family,names", [("hunyuan", ("keys", "values")), ("rwkv7", ("v_first",))])
def test_what_a_layer_hands_on_crosses_the_boundary(family_model, family, names):
    """Hunyuan's second layer of a pair attends with the first one's K/V projections, RWKV-7's
    layers read layer 0's v_first: a boundary between them carries those beside the hidden state."""
    model = family_model(family)
    layers = len(FAMILIES[family].layers)
    cfg = json.loads((model / "config.json").read_text())
    crossing = [b for b in range(1, layers) if support.handed_on(cfg, b)]
    assert crossing == ([1, 3, 5] if family == "hunyuan" else [1, 2, 3])
    stage = StageModel(model, crossing[0], layers)
    assert tuple(stage.extras_in) == names


def test_the_comparison_detects_handed_on_state_not_crossing(family_model, monkeypatch):
    """Hunyuan's layer 1 handed layer 0's values as its keys (and keys as values) must fail."""
    model = family_model("hunyuan")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    feed = stubs.Entry.feed

    def swapped(self, h, handed=None, before=None):
        feed(self, h, None if handed is None else (handed[0], handed[1][::-1]), before)

    monkeypatch.setattr(stubs.Entry, "feed", swapped)
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, [(0, 1), (1, 6)]))


def test_the_comparison_detects_v_first_not_crossing(family_model, monkeypatch):
    """RWKV-7 beyond the first stage on a v_first of zeros instead of layer 0's must fail."""
    model = family_model("rwkv7")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    feed = stubs.Entry.feed

    def zeroed(self, h, handed=None, before=None):
        feed(self, h, None if handed is None else (handed[0], mx.zeros_like(handed[1])), before)

    monkeypatch.setattr(stubs.Entry, "feed", zeroed)
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, [(0, 2), (2, 4)]))


def test_talkies_embedding_crosses_every_boundary_and_reaches_every_layer(family_model):
    """Talkie's blocks each take the normalised token embedding: every stage beyond the first
    receives it beside the hidden state (and runs every layer of its range on it)."""
    model = family_model("talkie")
    for start in (1, 2, 3):
        assert tuple(StageModel(model, start, 4).extras_in) == ("embedding",)
    assert StageModel(model, 0, 2).extras_in == {}
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    assert_same(expected, run_split(model, [(0, 1), (1, 3), (3, 4)]))  # one layer on each end stage


def test_the_comparison_detects_talkies_embedding_reaching_only_the_first_layer(family_model, monkeypatch):
    """A stage whose later layers took the embedding its model computed (zeros beyond the first
    stage) instead of the received one must fail: a layer of each stage but the first given it."""
    model = family_model("talkie")
    expected = reference(model, PROMPT, TOKENS, prefill_step=CHUNK)
    call = stubs.Given.__call__

    def entry_only(self, *args, **kwargs):  # as if only the stage's Entry replaced the argument
        return call(self, *args, **kwargs) if isinstance(self.layer, stubs.Entry) else self.layer(*args, **kwargs)

    monkeypatch.setattr(stubs.Given, "__call__", entry_only)
    with pytest.raises(AssertionError):
        assert_same(expected, run_split(model, [(0, 1), (1, 4)]))
