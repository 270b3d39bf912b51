"""Where prefill chunks are cut so that the stages overlap (pure: token counts in, cut points out).

A prompt's prefill flows through the stages chunk by chunk: stage 0 computes chunk k+1 while
stage 1 computes chunk k. With S stages of equal speed and n chunks whose costs on a stage are
c₁…cₙ, the prefill takes Σc + (S − 1)·max c whatever their order (a proportionate flow shop: the
largest chunk, not the first, sets what filling and draining the pipeline costs). mlx-lm's
generate_step cuts every `prefill_step_size` (2048) tokens: a 4096-token prompt is two chunks, so
two stages take 3/4 of one node's time at best, and a 1024-token prompt is one chunk (no overlap).
What overlaps the stages is many chunks, none large.

Equal chunks, not "smaller chunks early": by the sum above the order of the sizes buys nothing, only
the largest counts; and equal chunks are what generate_step itself cuts, so the pipelined prefill
keeps a promise a reader can check: bit for bit generate_step run with prefill_step_size = c.

Two plans, both pure:

- `pipelined_step` (PIPESERVE_PREFILL_CHUNKS=pipelined): one request's prompt is cut into equal
  chunks of `c` tokens, about CHUNKS_PER_STAGE per stage (the last one shorter), c a function of
  the prompt's length, the stage count and prefill_step_size only, so a resumed answer's prompt is
  cut exactly as the first time. With S·k chunks, filling and draining costs (S − 1)/(S·k) of a
  stage's share: 1/8 at 2 stages and k = 4.
- `overlap_rows` (PIPESERVE_PREFILL_BATCH=batched with PIPESERVE_PREFILL_CHUNKS=pipelined): a batch
  of several requests is cut into at least STEPS_PER_STAGE steps per stage (prefill_batch.aligned_steps
  then aligns the rows), so a batch no longer reaches stage 1 only once stage 0 has computed all of it.
"""

from __future__ import annotations

import math

from orchestrator import settings
from orchestrator.engine.coordinator.prefix_index import prefill_chunks

CHUNK_MODES = ("mlx", "pipelined")
CHUNKS_PER_STAGE = 4  # a lone prompt: about this many chunks per stage (fill + drain ≈ 1/8 of a stage's share at 2)
CHUNK_ALIGN = 64  # a pipelined chunk is a multiple of this many tokens (a round prefill_step_size to restate)
MIN_CHUNK = 128  # and never shorter: a shorter prompt is cut into fewer chunks (each step has its own costs)
STEPS_PER_STAGE = 2  # a batch of several prompts: at least this many steps per stage
MIN_STEP = 32  # tokens per row in a batch's step at least

Chunks = list[tuple[int, int, bool]]  # (start, end, checkpoint at end) of one prompt's prefill


def pipelined_chunks() -> bool:
    """Whether PIPESERVE_PREFILL_CHUNKS asks for the pipelined chunk plan."""
    return settings.PREFILL_CHUNKS.read() == "pipelined"


def pipelined_step(tokens: int, stages: int, step: int) -> int:
    """The chunk length for prefilling `tokens` positions alone through `stages` stages: about
    CHUNKS_PER_STAGE chunks per stage, a multiple of CHUNK_ALIGN, at least MIN_CHUNK, at most
    `step` (prefill_step_size). Depends only on these three: the same prompt is always cut alike."""
    want = math.ceil(max(tokens, 1) / (max(stages, 1) * CHUNKS_PER_STAGE))
    return min(step, max(MIN_CHUNK, math.ceil(want / CHUNK_ALIGN) * CHUNK_ALIGN))


def chunk_step(prompt_length: int, stages: int, step: int, pipelined: bool) -> int:
    """The prefill_step_size a prompt of `prompt_length` tokens is cut with: `step` (mlx, or one stage:
    nothing to overlap, so smaller chunks would only cost), or the pipelined chunk length. The promise
    either way: bit for bit generate_step with this step."""
    return pipelined_step(prompt_length, stages, step) if pipelined and stages > 1 else step


def prompt_chunks(prompt_length: int, start: int, stages: int, step: int, pipelined: bool,
                  marks: set[int] | frozenset[int] = frozenset()) -> Chunks:
    """The chunks that prefill prompt[start:-1]: every chunk_step tokens from `start`, and at each
    checkpoint mark. The length is the whole prompt's, never the part left after a cached prefix, so
    a prompt is cut with one chunk length whether it started cold (a resumed answer) or warm."""
    return prefill_chunks(prompt_length, start, chunk_step(prompt_length, stages, step, pipelined), marks)


def overlap_rows(rows: list[tuple[int, Chunks]], stages: int) -> list[tuple[int, Chunks]]:
    """A batch's rows (request id, its own chunks (start, end, checkpoint)) with cuts added every
    `piece` tokens from each row's start, so that the longest row spans at least STEPS_PER_STAGE
    steps per stage (pieces of MIN_STEP tokens at least). Each row's own cuts and checkpoints stay;
    rows of equal length get equal cuts. A batch of one row is left as it is (cut as alone)."""
    spans = [(chunks[0][0], chunks[-1][1]) for _, chunks in rows if chunks]
    if len(spans) < 2:
        return rows
    longest = max(end - start for start, end in spans)
    piece = max(MIN_STEP, math.ceil(longest / (max(stages, 1) * STEPS_PER_STAGE)))
    out = []
    for rid, chunks in rows:
        if not chunks:
            out.append((rid, chunks))
            continue
        start, end = chunks[0][0], chunks[-1][1]
        own = {e: checkpoint for _, e, checkpoint in chunks}
        cuts = sorted({*own, *range(start + piece, end, piece)})
        out.append((rid, [(a, b, own.get(b, False)) for a, b in zip([start, *cuts], cuts)]))
    return out


def batch_rows(rows: list[tuple[int, Chunks]], stages: int, pipelined: bool) -> list[tuple[int, Chunks]]:
    """A batched prefill's rows as the scheduler sends them: cut for overlap when pipelined."""
    return overlap_rows(rows, stages) if pipelined else rows


__all__ = ["CHUNKS_PER_STAGE", "CHUNK_ALIGN", "CHUNK_MODES", "MIN_CHUNK", "MIN_STEP", "STEPS_PER_STAGE", "Chunks",
           "batch_rows", "chunk_step", "overlap_rows", "pipelined_chunks", "pipelined_step", "prompt_chunks"]
