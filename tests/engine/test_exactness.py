"""Exactness, the engine's first promise: greedy output through any split equals mlx-lm.

Stages are real processes exchanging tensors over TCP; the coordinator's scheduler runs
in the test process so the comparison sees token ids and float32 log-probs directly.
"""

from __future__ import annotations

import pytest

from orchestrator.engine.stage.shard import StageModel
from tests.support.engine_harness import InTestCoordinator, assert_same, reference, split_in_process

SHORT = [5, 17, 101, 33, 7]
LONG = [(i * 37 + 11) % 500 for i in range(40)]

CASES = [
    # (model options, inclusive layer splits)
    pytest.param({}, [(0, 1), (2, 3)], id="2-stages-f32-tied"),
    pytest.param({}, [(0, 0), (1, 1), (2, 2), (3, 3)], id="4-one-layer-stages"),
    pytest.param({"layers": 6, "tied": False}, [(0, 0), (1, 4), (5, 5)], id="3-stages-f32-untied"),
    pytest.param({"dtype": "bfloat16"}, [(0, 2), (3, 3)], id="2-stages-bf16-tied"),
    pytest.param({"dtype": "bfloat16", "tied": False, "shards": 2}, [(0, 0), (1, 2), (3, 3)],
                 id="3-stages-bf16-untied-sharded"),
]


@pytest.mark.parametrize("options,splits", CASES)
def test_pipeline_equals_mlx_lm(model_factory, launch, options, splits):
    model = model_factory(**options)
    cluster = launch(model, splits, coordinator=False, prefill_step_size=16)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        for prompt in (SHORT, LONG):  # LONG prefills in chunks of 16, 16, 7 then samples
            assert_same(reference(model, prompt, 24, prefill_step=16), coord.run(prompt, 24))
    finally:
        coord.stop()


def test_concurrent_requests_each_equal_their_solo_run(model_factory, launch):
    model = model_factory()
    prompts = [SHORT, LONG, [9, 8, 7], [300, 301, 302, 303, 304, 305]]
    expected = [reference(model, p, 30) for p in prompts]
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        gens = [coord.generate(p, 30) for p in prompts]
        for exp, gen in zip(expected, gens):
            assert_same(exp, coord.collect(gen))
        stats = coord.stage_stats(lambda st: all(s.get("max_batch", 0) >= 2 for s in st))
        batches = [s.get("max_batch", 0) for s in stats]
    finally:
        coord.stop()
    assert min(batches) >= 2, f"decode steps were never micro-batched: {batches}"


def test_micro_batching_runs_several_requests_in_one_step(model_factory):
    """The batched decode path really batches, and gives each row its solo tokens.

    Bit-identity of batched rows is a property of the BLAS (OpenBLAS, loaded here, picks a
    different kernel for one row than for several at some widths); `test_families.py`
    proves it bit for bit under the reference BLAS.
    """
    import mlx.core as mx

    model = model_factory()
    stage = StageModel(model, 0, 4)
    prompts = [SHORT, [9, 8, 7], [300, 301, 302, 303]]
    solo_caches = [stage.make_cache() for _ in prompts]
    batch_caches = [stage.make_cache() for _ in prompts]
    for p, c1, c2 in zip(prompts, solo_caches, batch_caches):
        stage.forward(mx.array(p)[None], c1), stage.forward(mx.array(p)[None], c2)
        mx.eval([c.state for c in c1 + c2])
    tokens = [1, 2, 3]
    for _ in range(5):
        solo = [stage.logprobs(stage.forward(mx.array([t])[None], c)) for t, c in zip(tokens, solo_caches)]
        hs = stage.forward_batch([mx.array([t])[None] for t in tokens], batch_caches)
        batched = [stage.logprobs(h) for h in hs]
        assert stage.batchable, f"the step was not batched: {stage.batch_refusal}"
        for a, b in zip(solo, batched):
            assert mx.argmax(a).item() == mx.argmax(b).item(), "a batched row picked another token"
            assert mx.abs(a - b).max().item() < 1e-4, "a batched row differs from its solo step"
        tokens = [int(mx.argmax(x).item()) for x in solo]


class _RowsRefused(StageModel):
    """A stage whose batched forward fails halfway, after it has written to the caches."""

    def _forward_rows(self, xs, caches):
        super()._forward_rows(xs[:1], caches[:1])  # half a step: the first cache moved on
        raise RuntimeError("this family cannot batch")


@pytest.mark.parametrize("method,flag,reason", [("forward_batch", "batchable", "batch_refusal"),
                                                ("forward_chunks", "chunks_batchable", "chunks_refusal")])
def test_a_refused_batch_restores_the_caches_and_runs_the_rows_one_by_one(model_factory, method, flag, reason):
    """A batched step the family refuses leaves no trace: every cache is restored, the rows run one by
    one with their solo results, and the stage says why and batches no more (decode and prefill alike)."""
    import mlx.core as mx

    model = model_factory()
    broken, solo = _RowsRefused(model, 0, 4), StageModel(model, 0, 4)
    prompts = [SHORT, [300, 301, 302, 303, 304]]
    width = 1 if method == "forward_batch" else 3
    inputs = [mx.array(p[:width])[None] for p in prompts]
    caches, solo_caches = [broken.make_cache() for _ in prompts], [solo.make_cache() for _ in prompts]
    for p, c1, c2 in zip(prompts, caches, solo_caches):
        broken.forward(mx.array(p)[None], c1), solo.forward(mx.array(p)[None], c2)
    out = getattr(broken, method)(inputs, caches)
    expected = [solo.forward(x, c) for x, c in zip(inputs, solo_caches)]
    assert not getattr(broken, flag) and "cannot batch" in getattr(broken, reason)
    assert [c.offset for c in caches[0]] == [c.offset for c in solo_caches[0]], "a cache was not restored"
    for a, b in zip(out, expected):
        assert mx.array_equal(a, b).item(), "a row run after the refusal differs from its solo forward"


class _MaskDropped(StageModel):
    """A deliberately broken stage: attends without the causal mask during prefill."""

    def make_cache(self):
        caches = super().make_cache()
        for c in caches:
            c.make_mask = lambda *a, **k: None
        return caches


@pytest.mark.parametrize("broken", ["layer-skipped", "mask-dropped"])
def test_the_comparison_detects_a_broken_split(model_factory, broken):
    model = model_factory()
    expected = reference(model, LONG, 12)
    if broken == "layer-skipped":
        stages = [StageModel(model, 0, 1), StageModel(model, 2, 4)]  # layer 1 never runs
    else:
        stages = [_MaskDropped(model, 0, 2), StageModel(model, 2, 4)]
    with pytest.raises(AssertionError):
        assert_same(expected, split_in_process(stages, LONG, 12))
    # and the same in-process runner with a correct split passes, so it is the break that fails
    assert_same(expected, split_in_process([StageModel(model, 0, 2), StageModel(model, 2, 4)], LONG, 12))


def test_real_smollm2_split_equals_mlx_lm(demo_model_dir, launch):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tok = load_tokenizer(demo_model_dir)
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                          add_generation_prompt=True))
    cluster = launch(demo_model_dir, [(0, 14), (15, 29)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        got = coord.run(prompt, 12)
    finally:
        coord.stop()
    assert_same(reference(demo_model_dir, prompt, 12), got)
    assert "Paris" in tok.decode(got.tokens)
