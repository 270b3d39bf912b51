"""Batched prefill (PIPESERVE_PREFILL_BATCH=batched): concurrent prompts go through the stages together.

The promise of that mode is not bit-identity but closeness: greedy tokens equal to single-process
mlx-lm's on the test models, each log-prob within LOGPROB_TOLERANCE of it. The batch really is
taken (every stage counts the prefill chunks it ran in a batched forward), and never in the default
exact mode, whose bit-identity `test_exactness.py` keeps.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from orchestrator.engine.coordinator.prefill_batch import PREFILL_ROWS, Chunk, PrefillBatch, aligned_steps
from orchestrator.engine.coordinator.prefix_index import prefill_chunks
from orchestrator.engine.coordinator.requests import Active
from orchestrator.engine.stage.shard import StageModel
from tests.support.engine_harness import InTestCoordinator, reference

# float32 test models: a [B, L] product rounds differently from [1, L] ones (measured ~1e-6 here;
# docs/benchmark.md measured 7e-5 on SmolLM2's 30 layers)
LOGPROB_TOLERANCE = 1e-3

PROMPTS = [
    [(i * 37 + 11) % 500 for i in range(40)],  # chunks of 16, 16, 7 at prefill_step_size=16
    [(i * 53 + 5) % 500 for i in range(40)],   # the same length: cut exactly as alone
    [(i * 29 + 3) % 500 for i in range(23)],   # shorter: its cuts meet the others'
    [5, 17, 101, 33, 7],
    [9, 8, 7],
    [(i * 31 + 2) % 500 for i in range(34)],
]


def _chunks(length: int, step: int, marks: frozenset[int] = frozenset()) -> list[tuple[int, int, bool]]:
    return prefill_chunks(length, 0, step, marks)


def test_rows_of_equal_length_are_cut_as_alone():
    rows = [(1, _chunks(40, 16)), (2, _chunks(40, 16))]
    steps = aligned_steps(rows)
    assert [[(c.start, c.end) for c in s] for s in steps] == [[(0, 16)] * 2, [(16, 32)] * 2, [(32, 39)] * 2]


def test_every_step_is_of_one_length_and_keeps_each_rows_own_cuts():
    rows = [(1, _chunks(40, 16, frozenset({10}))), (2, _chunks(23, 16)), (3, _chunks(3, 16)), (4, _chunks(1, 16))]
    steps = aligned_steps(rows)
    for s in steps:
        assert len({c.end - c.start for c in s}) == 1
    for rid, own in rows:
        mine = [c for s in steps for c in s if c.rid == rid]
        covered = [(c.start, c.end) for c in mine]
        assert covered == sorted(covered) and all(a[1] == b[0] for a, b in zip(covered, covered[1:]))
        if own:
            assert covered[0][0] == own[0][0] and covered[-1][1] == own[-1][1]
        assert {end for _, end, _ in own} <= {c.end for c in mine}  # the exact way's cuts stay cuts
        assert [c.end for c in mine if c.checkpoint] == [end for _, end, cp in own if cp]
    assert Chunk(1, 0, 2, False) in steps[0]  # the 3-token prompt's 2 set the first step's length
    assert all(c.rid != 4 for s in steps for c in s)  # a 1-token prompt has nothing to prefill


def _active(rid: int) -> Active:
    return Active(gen=None, rid=rid)  # type: ignore[arg-type]


def test_a_batch_waits_for_the_first_tokens_of_the_one_in_flight():
    book = {r: _active(r) for r in range(1, PREFILL_ROWS + 4)}
    batch = PrefillBatch(batched=True)
    batch.wait(book[1])
    assert [a.rid for a in batch.take(book)] == [1]
    for r in range(2, PREFILL_ROWS + 4):
        batch.wait(book[r])
    assert batch.take(book) == []  # request 1's first token is still due
    book[1].generated = 1
    assert [a.rid for a in batch.take(book)] == list(range(2, PREFILL_ROWS + 2))  # at most PREFILL_ROWS
    del book[2]  # finished or failed: no longer owed
    for r in range(3, PREFILL_ROWS + 2):
        book[r].generated = 1
    assert [a.rid for a in batch.take(book)] == [PREFILL_ROWS + 2, PREFILL_ROWS + 3]


def test_stage_batched_chunks_are_close_to_one_at_a_time(model_factory):
    model = model_factory()
    stage = StageModel(model, 0, 4)
    prompts = [mx.array(p[:16])[None] for p in PROMPTS[:3]]
    alone = [stage.make_cache() for _ in prompts]
    together = [stage.make_cache() for _ in prompts]
    solo = [stage.forward(x, c) for x, c in zip(prompts, alone)]
    batched = stage.forward_chunks(prompts, together)
    assert stage.chunks_batchable, stage.chunks_refusal
    for a, b in zip(solo, batched):
        assert mx.allclose(a, b, rtol=1e-4, atol=1e-3).item(), mx.abs(a - b).max().item()
    nexts = [stage.logprobs(stage.forward(mx.array([t])[None], c)) for t, c in zip((1, 2, 3), alone)]
    after = [stage.logprobs(stage.forward(mx.array([t])[None], c)) for t, c in zip((1, 2, 3), together)]
    for a, b in zip(nexts, after):
        assert mx.abs(a - b).max().item() < LOGPROB_TOLERANCE


def _served(model, launch, monkeypatch, mode: str, max_batch: int = 16):
    monkeypatch.setenv("PIPESERVE_PREFILL_BATCH", mode)
    cluster = launch(model, [(0, 1), (2, 3)], coordinator=False, prefill_step_size=16, max_batch=max_batch)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        gens = [coord.generate(p, 12) for p in PROMPTS]
        traces = [coord.collect(g) for g in gens]
        stats = coord.stage_stats(lambda st: all(s.get("steps", 0) > 0 for s in st))
        return traces, [s.get("batched_chunks", 0) for s in stats], coord.pipeline.prefills.batches
    finally:
        coord.stop()


@pytest.mark.parametrize("max_batch", [16, 2])  # 2: a batch's first decode steps go as several micro-batches
def test_batched_prefill_is_taken_and_close_to_mlx_lm(model_factory, launch, monkeypatch, max_batch):
    model = model_factory()
    expected = [reference(model, p, 12, prefill_step=16) for p in PROMPTS]
    traces, batched_chunks, batches = _served(model, launch, monkeypatch, "batched", max_batch)
    for exp, got in zip(expected, traces):
        assert got.tokens == exp.tokens
        for a, b in zip(exp.logprobs, got.logprobs):
            assert abs(a - b) < LOGPROB_TOLERANCE
    # six prompts sent together: the first may go alone, the rest wait for its first token and go as one
    assert batches < len(PROMPTS), batches
    assert all(n >= 2 for n in batched_chunks), f"no stage ran a batched prefill: {batched_chunks}"


def test_default_mode_never_batches_a_prefill(model_factory, launch, monkeypatch):
    """Unset means exact: no prefill chunk is batched (its bit-identity to mlx-lm: test_exactness.py;
    six concurrent answers' decode rows batch, which OpenBLAS rounds by width: not compared here)."""
    _, batched_chunks, batches = _served(model_factory(), launch, monkeypatch, "")
    assert batched_chunks == [0, 0] and batches == 0
