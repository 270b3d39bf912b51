"""Batched prefill: the prompts of concurrent requests go through the stages together.

With `PIPESERVE_PREFILL_BATCH=batched` a request the scheduler admits does not send its prefill
chunks at once (one request after another, the `exact` way); it waits here with the others that
arrive meanwhile, and they go together: their chunks cut so that each step holds one chunk of
every member of equal length (`aligned_steps`), sent as one group of FORWARD frames flagged BATCH,
which every stage runs as one batched forward (StageModel.forward_chunks: projections and MLP over
[B, L], attention row by row against each request's own cache), then their first decode steps as
one micro-batch. A batch goes when the previous one has given all its first tokens (as mlx-lm's
batch generator takes the prompts waiting when its step ends): the requests that arrived while a
batch was in flight are the next batch.

Not bit for bit: [B, L] matrix products round differently from [1, L] ones (docs/benchmark.md).
Each row's cut points include its own `exact` ones (prefill_step_size, checkpoints), so a request
alone, or with companions of equal length, is cut as generate_step cuts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator import settings
from orchestrator.engine.coordinator.requests import Active

MODES = ("exact", "batched")
PREFILL_ROWS = 8  # requests per batch at most: mlx-lm's BatchGenerator's prefill_batch_size


def batched_mode() -> bool:
    """Whether PIPESERVE_PREFILL_BATCH asks for batched prefill."""
    return settings.PREFILL_BATCH.read() == "batched"


@dataclass(frozen=True)
class Chunk:
    """One member's chunk in one batched step: prompt[start:end], a checkpoint taken at `end` or not."""

    rid: int
    start: int
    end: int
    checkpoint: bool


def aligned_steps(rows: list[tuple[int, list[tuple[int, int, bool]]]]) -> list[list[Chunk]]:
    """The batched steps of several requests' prefills (pure).

    `rows`: each request's id and its own chunks (start, end, checkpoint), as `prefill_chunks` cuts
    them. Every step holds one chunk of each request not yet done, all of one length: the shortest
    of their distances to their own next cut. So every own cut stays a cut (a checkpoint lands
    where the exact way takes it) and rows of equal length are cut exactly as alone."""
    todo = [(rid, [(end, checkpoint) for _, end, checkpoint in chunks], chunks[0][0])
            for rid, chunks in rows if chunks]
    steps: list[list[Chunk]] = []
    while todo:
        length = min(cuts[0][0] - at for _, cuts, at in todo)
        step, left = [], []
        for rid, cuts, at in todo:
            end, checkpoint = cuts[0]
            reached = at + length == end
            step.append(Chunk(rid, at, at + length, checkpoint and reached))
            rest = cuts[1:] if reached else cuts
            if rest:
                left.append((rid, rest, at + length))
        steps.append(step)
        todo = left
    return steps


@dataclass
class PrefillBatch:
    """The requests waiting for their batched prefill, and the batch in flight (the scheduler's)."""

    batched: bool
    waiting: list[int] = field(default_factory=list)  # request ids, in arrival order
    out: list[int] = field(default_factory=list)  # the batch in flight: ids whose first token is due
    batches: int = 0  # batches sent (a test reads it)

    def wait(self, a: Active) -> None:
        """An admitted request waits for the next batch."""
        self.waiting.append(a.rid)

    def take(self, active: dict[int, Active]) -> list[Active]:
        """The next batch, or [] while the one in flight still owes a first token (or none waits).
        Requests no longer active (finished, failed, held after a lost stage) are dropped."""
        self.out = [r for r in self.out if r in active and active[r].generated == 0 and not active[r].replay]
        self.waiting = [r for r in self.waiting if r in active]
        if self.out or not self.waiting:
            return []
        ids, self.waiting = self.waiting[:PREFILL_ROWS], self.waiting[PREFILL_ROWS:]
        self.out = list(ids)
        self.batches += 1
        return [active[r] for r in ids]


__all__ = ["MODES", "PREFILL_ROWS", "Chunk", "PrefillBatch", "aligned_steps", "batched_mode"]
