"""Pipelined prefill (PIPESERVE_PREFILL_CHUNKS=pipelined): a long prompt cut into about 4 equal chunks per
stage, so the stages compute different chunks at once.

The promise: bit for bit single-process mlx-lm's generate_step run with prefill_step_size = c, the
plan's chunk length (prefill_plan.py). Real stage processes over TCP, the scheduler in the test
process. The comparison bites: generate_step's default cut gives other log-probs, and a scheduler
cutting at the wrong length fails it. The stages really run the smaller chunks: their step counters
count them. A resumed answer's prompt is cut as the first time: it resumes exactly.
"""

from __future__ import annotations

import time

import pytest

from orchestrator.engine.coordinator import prefill_plan
from orchestrator.engine.coordinator.prefill_plan import pipelined_step
from orchestrator.engine.coordinator.prefix_index import prefill_chunks
from tests.support.engine_harness import InTestCoordinator, assert_same, reference
from tests.support.resume import Killer, answer

PROMPT = [(i * 37 + 11) % 500 for i in range(600)]  # 599 positions to prefill: 5 chunks of 128 on 2 stages
STEP = 2048  # the cluster's prefill_step_size (the default): the mlx cut is one chunk of 599
TOKENS = 16


@pytest.fixture
def pipelined(monkeypatch):
    monkeypatch.setenv("PIPESERVE_PREFILL_CHUNKS", "pipelined")
    monkeypatch.setenv("PIPESERVE_CANARY_INTERVAL_S", "600")  # no idle canary between the counted steps


def _stage_steps(coord: InTestCoordinator, at_least: list[int]) -> list[int]:
    """Each stage's step counter once it reached `at_least` and two PONGs (0.5 s apart) agree: the
    readiness probe's steps may still be on their way when the pipeline turns ready."""
    last: list[int] = []
    for _ in range(20):
        stats = coord.stage_stats(lambda st: all(s.get("steps", -1) >= n for s, n in zip(st, at_least)))
        steps = [s["steps"] for s in stats]
        if steps == last:
            return steps
        last = steps
        time.sleep(1.2)
    raise AssertionError(f"the stages' step counters never settled: {last}")


def test_a_pipelined_prefill_equals_generate_step_with_its_chunk_length(model_factory, launch, pipelined):
    model = model_factory()
    c = pipelined_step(len(PROMPT), 2, STEP)
    assert c == 128
    expected = reference(model, PROMPT, TOKENS, prefill_step=c)
    with pytest.raises(AssertionError, match="log-prob"):  # generate_step's own cut rounds otherwise
        assert_same(reference(model, PROMPT, TOKENS, prefill_step=STEP), expected)
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=STEP)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        assert coord.pipeline.pipelined
        before = _stage_steps(coord, [1, 1])  # the readiness probe's step at least
        assert_same(expected, coord.run(PROMPT, TOKENS))
        # every stage ran the prompt's chunks (5 of at most 128 tokens, where mlx cuts one of 599),
        # then one step per token
        chunks = len(prefill_chunks(len(PROMPT), 0, c))
        assert chunks == 5
        after = _stage_steps(coord, [n + chunks + TOKENS for n in before])
        assert [a - b for a, b in zip(after, before)] == [chunks + TOKENS] * 2
    finally:
        coord.stop()


def test_a_wrong_cut_fails_the_comparison(model_factory, launch, pipelined, monkeypatch):
    """The same comparison with the scheduler cutting 64 tokens longer than the plan: it fails."""
    model = model_factory()
    expected = reference(model, PROMPT, TOKENS, prefill_step=pipelined_step(len(PROMPT), 2, STEP))
    monkeypatch.setattr(prefill_plan, "pipelined_step", lambda tokens, stages, step: 192)
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=STEP)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        got = coord.run(PROMPT, TOKENS)
    finally:
        coord.stop()
    with pytest.raises(AssertionError, match="log-prob|tokens differ"):
        assert_same(expected, got)
    assert_same(reference(model, PROMPT, TOKENS, prefill_step=192), got)  # it is the cut, nothing else


def test_the_default_cuts_as_mlx(model_factory, launch, monkeypatch):
    monkeypatch.delenv("PIPESERVE_PREFILL_CHUNKS", raising=False)
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=STEP)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        assert not coord.pipeline.pipelined
        assert_same(reference(model, PROMPT, TOKENS, prefill_step=STEP), coord.run(PROMPT, TOKENS))
    finally:
        coord.stop()


def test_a_pipelined_answer_resumes_exactly_after_a_stage_is_killed(model_factory, launch):
    """The prompt is cut again as the first time (c depends on its length, the stages and the step
    only): the regenerated tokens match, checked token by token, and the answer equals its undisturbed run."""
    model = model_factory(layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)
    cluster = launch(model, [(0, 1), (2, 3)], env={"PIPESERVE_PREFILL_CHUNKS": "pipelined"})
    request = {"model": model.name, "prompt": PROMPT, "max_tokens": 48, "logprobs": 1, "stream": True,
               "temperature": 0}
    undisturbed = answer(cluster, request)
    kill = Killer(cluster, "stage-1", 12)
    assert answer(cluster, request, kill) == undisturbed
    assert kill.resumed() == 1


BATCH = [[(i * k + 3) % 500 for i in range(128)] for k in (29, 31, 37, 41)]  # 127 positions: one chunk of c=128


def test_a_batched_prefill_is_cut_into_steps_per_stage(model_factory, launch, pipelined, monkeypatch):
    """With PIPESERVE_PREFILL_BATCH=batched the rows of a batch are cut into at least 2 steps per
    stage (32-token pieces here, where each row's own cut is one chunk): every stage counts 4 batched
    chunks per row, at least 8 for a batch of 2 (at most 4 without the pieces). Batched prefill keeps
    its own promise: greedy tokens equal, log-probs within float rounding (test_prefill_batch.py)."""
    monkeypatch.setenv("PIPESERVE_PREFILL_BATCH", "batched")
    model = model_factory()
    expected = [reference(model, p, 8) for p in BATCH]
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=STEP)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        traces = [coord.collect(g) for g in [coord.generate(p, 8) for p in BATCH]]
        stats = coord.stage_stats(lambda st: all(s.get("batched_chunks", 0) >= 8 for s in st))
    finally:
        coord.stop()
    for exp, got in zip(expected, traces):
        assert got.tokens == exp.tokens
        assert max(abs(a - b) for a, b in zip(exp.logprobs, got.logprobs)) < 1e-3
    assert all(s["batched_chunks"] % 4 == 0 for s in stats), stats  # whole rows of 4 pieces
