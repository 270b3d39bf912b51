"""The pipelined prefill plan (pure): where a prompt's chunks are cut so that the stages overlap.

What the scheduler sends with it, and that the answer stays bit for bit mlx-lm's generate_step run
with that chunk length: tests/engine/test_pipelined_prefill.py.
"""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator.prefill_plan import (
    CHUNK_ALIGN,
    CHUNKS_PER_STAGE,
    MIN_CHUNK,
    MIN_STEP,
    STEPS_PER_STAGE,
    batch_rows,
    chunk_step,
    overlap_rows,
    pipelined_chunks,
    pipelined_step,
    prompt_chunks,
)
from orchestrator.engine.coordinator.prefix_index import prefill_chunks


@pytest.mark.parametrize("tokens,stages,step,expected", [
    (4096, 2, 2048, 512),   # 8 chunks: 4 per stage
    (4096, 4, 2048, 256),
    (1024, 2, 2048, 128),
    (1000, 2, 2048, 128),   # rounded up to a multiple of 64
    (3000, 2, 2048, 384),   # 375 -> 384
    (300, 2, 2048, 128),    # never below MIN_CHUNK: fewer chunks
    (5, 2, 2048, 128),
    (100_000, 2, 2048, 2048),  # never above prefill_step_size
    (4096, 2, 16, 16),      # a small prefill_step_size wins (the tests' clusters)
])
def test_pipelined_step(tokens, stages, step, expected):
    assert pipelined_step(tokens, stages, step) == expected


@pytest.mark.parametrize("tokens", [129, 700, 1024, 2500, 4096, 9000, 33_000])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_long_prompt_is_cut_into_about_four_equal_chunks_per_stage(tokens, stages):
    c = pipelined_step(tokens, stages, 2048)
    chunks = prefill_chunks(tokens, 0, c, frozenset())
    sizes = [end - start for start, end, _ in chunks]
    assert c % CHUNK_ALIGN == 0 and MIN_CHUNK <= c <= 2048
    assert all(s == c for s in sizes[:-1]) and 0 < sizes[-1] <= c  # generate_step's cut: equal, the last shorter
    if MIN_CHUNK < c < 2048:  # neither bound binds: the shortest aligned c giving CHUNKS_PER_STAGE per stage
        want = -(-tokens // (stages * CHUNKS_PER_STAGE))
        assert c - CHUNK_ALIGN < want <= c and len(chunks) <= stages * CHUNKS_PER_STAGE


def test_chunk_step_is_mlx_unless_pipelined_and_depends_on_the_whole_prompt():
    assert chunk_step(4096, 2, 2048, pipelined=False) == 2048
    assert chunk_step(4096, 2, 2048, pipelined=True) == 512
    assert chunk_step(4096, 1, 2048, pipelined=True) == 2048  # one stage: nothing overlaps, mlx's cut
    # a prompt-cache hit prefills only the tail, cut with the whole prompt's chunk length: a resumed
    # answer (cold) is cut every 512 from 0, the first run every 512 from the reused prefix
    assert prompt_chunks(4096, 0, 2, 2048, True) == prefill_chunks(4096, 0, 512)
    assert prompt_chunks(4096, 3000, 2, 2048, True) == [(3000, 3512, False), (3512, 4024, False),
                                                        (4024, 4095, False)]
    assert prompt_chunks(4096, 0, 2, 2048, False) == [(0, 2048, False), (2048, 4095, False)]


def test_checkpoint_marks_stay_cuts():
    chunks = prompt_chunks(1024, 0, 2, 2048, True, {300})
    assert (256, 300, True) in chunks and (300, 384, False) in chunks
    assert [e for _, e, cp in chunks if cp] == [300]


def test_the_setting_reads_the_environment(monkeypatch):
    monkeypatch.delenv("PIPESERVE_PREFILL_CHUNKS", raising=False)
    assert not pipelined_chunks()  # the default: mlx's cut
    monkeypatch.setenv("PIPESERVE_PREFILL_CHUNKS", "pipelined")
    assert pipelined_chunks()
    monkeypatch.setenv("PIPESERVE_PREFILL_CHUNKS", "smaller-early")
    with pytest.raises(ValueError, match="PIPESERVE_PREFILL_CHUNKS|one of"):
        pipelined_chunks()


def _covered(chunks):
    return all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))


def test_overlap_rows_cut_a_batch_into_steps_per_stage_keeping_each_rows_cuts():
    rows = [(1, prefill_chunks(128, 0, 2048)), (2, prefill_chunks(128, 0, 2048, {40})),
            (3, prefill_chunks(20, 0, 2048)), (4, [])]
    out = dict(overlap_rows(rows, 2))
    piece = max(MIN_STEP, -(-127 // (2 * STEPS_PER_STAGE)))
    assert [e for _, e, _ in out[1]] == [piece, 2 * piece, 3 * piece, 127]
    assert len(out[1]) >= 2 * STEPS_PER_STAGE
    assert [e for _, e, cp in out[2] if cp] == [40] and 40 in {e for _, e, _ in out[2]}
    assert out[3] == [(0, 19, False)]  # shorter than a piece: as it was
    assert out[4] == []
    for rid, chunks in rows:
        if chunks:
            assert out[rid][0][0] == chunks[0][0] and out[rid][-1][1] == chunks[-1][1] and _covered(out[rid])
            assert {e for _, e, _ in chunks} <= {e for _, e, _ in out[rid]}


def test_a_batch_of_one_is_cut_as_alone_and_mlx_mode_adds_no_cut():
    alone = [(1, prefill_chunks(1024, 0, 128))]
    assert overlap_rows(alone, 2) == alone
    rows = [(1, prefill_chunks(128, 0, 2048)), (2, prefill_chunks(128, 0, 2048))]
    assert batch_rows(rows, 2, pipelined=False) == rows
    assert batch_rows(rows, 2, pipelined=True) == overlap_rows(rows, 2) != rows
