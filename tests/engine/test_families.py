"""The exactness matrix: every family the engine claims, split, equals single-process mlx-lm.

Models come from mlx-lm's own classes with random weights (orchestrator/models/families.py):
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

from orchestrator.engine import stubs, support
from orchestrator.engine.shard import ShardError, StageModel
from orchestrator.models.families import FAMILIES, build_family_model

from .harness import InTestCoordinator, assert_same, reference, split_in_process

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 16
CHUNK = 16
NAMES = sorted(FAMILIES)
MOE = {name for name, spec in FAMILIES.items() if spec.moe}


@pytest.fixture(scope="module")
def family_model(tmp_path_factory: pytest.TempPathFactory):
    """`family_model(name, dtype="float32", quant=None)` builds each variant once."""
    root = tmp_path_factory.mktemp("families")
    made: dict[tuple, Path] = {}

    def make(name: str, dtype: str = "float32", quant: str | None = None) -> Path:
        key = (name, dtype, quant)
        if key not in made:
            made[key] = build_family_model(root / "-".join(str(k) for k in key), name, dtype=dtype, quant=quant)
        return made[key]

    return make


def splits(layers: int) -> list[list[tuple[int, int]]]:
    """Half-open layer ranges: after the first layer, in the middle, and three ways."""
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
    for bounds in splits(len(FAMILIES[family].layers)):
        assert_same(expected, run_split(model, bounds))


@pytest.mark.parametrize("family,dtype,quant", [
    *[(name, "float32", "q4") for name in NAMES],
    *[(name, "float32", "mixed") for name in NAMES],
    *[(name, "bfloat16", None) for name in NAMES if name not in MOE],  # CPU GatherMM is float32-only
    ("llama", "float16", None), ("qwen3", "float32", "q6"), ("gemma3_text", "float32", "q8"),
    ("gpt_oss", "float32", "mxfp4"), ("qwen3_moe", "float32", "mxfp4"),
])
def test_formats_split_equal_mlx_lm(family_model, family, dtype, quant):
    model = family_model(family, dtype, quant)
    layers = len(FAMILIES[family].layers)
    assert_same(reference(model, PROMPT, TOKENS, prefill_step=CHUNK), run_split(model, splits(layers)[2]))


def test_batched_decode_is_bit_identical_for_every_family(tmp_path):
    """Under the reference BLAS a micro-batched decode step equals each request's solo step bit
    for bit (the stage's batching, not the BLAS, is what this checks), and every family's
    decode steps really run batched (gemma2 and MLA through support.ROW_ATTENTION)."""
    env = {**os.environ, "PIPESERVE_BLAS": "reference"}
    out = subprocess.run([sys.executable, "-m", "tests.engine.batch_check", str(tmp_path), *NAMES],
                         capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["family"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(results) == set(NAMES)
    assert all(r["blas"] == "reference" for r in results.values())
    wrong = {f: r for f, r in results.items() if not r["exact"]}
    assert not wrong, f"batched rows differ from solo steps: {wrong}"
    unbatched = {f: r["refusal"] for f, r in results.items() if not r["batched"]}
    assert not unbatched, f"decode steps fell back to one request at a time: {unbatched}"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3_text", "gpt_oss", "deepseek_v3", "qwen3_next", "nemotron_h", "jamba"])
def test_real_stages_serve_concurrent_requests_like_solo_runs(family_model, launch, family):
    """Real stage processes over TCP; three requests at once, each with its solo tokens."""
    model = family_model(family)
    layers = len(FAMILIES[family].layers)
    prompts = [PROMPT, PROMPT[:9], PROMPT[5:30]]
    expected = [reference(model, p, 12, prefill_step=2048) for p in prompts]
    cluster = launch(model, [(0, 0), (1, layers // 2), (layers // 2 + 1, layers - 1)], coordinator=False)
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


# --- refusals ---------------------------------------------------------------------------

def test_a_stage_refuses_an_unsupported_family(family_model, tmp_path):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(family_model("llama"), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "model_type": "rwkv7"}))
    with pytest.raises(ShardError, match="rwkv7.*not verified exact"):
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
