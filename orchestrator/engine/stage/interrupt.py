"""Abandoning a long step between layers: a RESET read while a prefill chunk computes ends it there.

MLX evaluates a step's graph in one go, so a stage computing a long prefill chunk could not look
at anything else until the chunk was done (seconds on a slow BLAS): after a stage was lost, the
survivors' RESET and the recovery's readiness probe waited behind the chunks of requests that
were being dropped anyway. A step of at least INTERRUPTIBLE_TOKENS positions is therefore
evaluated layer by layer (`stand_ins.Checkpoint` around each layer the stage runs: the same
operations, so the same results), and after each layer the stage asks whether a RESET has been
read since the step's frames were. If so the step stops with `Abandoned`; its requests (their
caches now half-advanced) are dropped by that RESET, which the stage handles next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

INTERRUPTIBLE_TOKENS = 16  # positions in one step from which it is evaluated layer by layer
OVERLAP_EVERY = 4  # other steps: every this many layers, evaluation starts while Python builds the rest
LAYER_PAUSE_S = 0.5  # the test fault `layer-pause`: a pause after each layer of an interruptible step


def overlap_for(blas_threads: int, cores: int) -> int:
    """How often a step's layers start computing while the rest is built, for a step on `blas_threads`
    of the host's `cores`: only with a core left for Python. Measured with SmolLM2's stages, steps
    interleaved: at 1 of 2 threads 8 % faster; at 2 of 2 within ±4 % (docs/benchmark.md)."""
    return OVERLAP_EVERY if blas_threads < cores else 0


class Abandoned(Exception):
    """A step stopped between two layers: a RESET was read while it computed."""


class LayerChecks:
    """Owned by the MLX thread: whether the step now computing is interruptible, and how to tell."""

    def __init__(self) -> None:
        self._stale: Callable[[], bool] | None = None
        self.pause_s = 0.0  # > 0 only under the `layer-pause` fault (faults.py)
        self.layers_done = 0  # layers evaluated one by one in the current step
        self.overlap_every = OVERLAP_EVERY  # 0: build the whole graph of a step before evaluating it
        self._built = 0  # layers built outside an interruptible step

    @contextmanager
    def interruptible(self, stale: Callable[[], bool]) -> Iterator[None]:
        """Evaluate the layers called inside this block one by one, asking `stale()` after each."""
        self._stale, self.layers_done = stale, 0
        try:
            yield
        finally:
            self._stale = None

    def after_layer(self, out: Any) -> None:
        """Called by each wrapped layer with its output: evaluate it, then stop if the step is stale.

        Outside an interruptible step, every `overlap_every` layers the output's evaluation starts in the
        background (`mx.async_eval`), as `mlx_lm.generate_step` overlaps its next step: the layers built so
        far compute while Python builds the next ones, instead of the whole graph first and then all the
        compute (building SmolLM2's 30 layers takes ~5 ms of a ~90 ms decode step). Same operations, same
        order: the same bits.
        """
        arrays = [a for a in (out if isinstance(out, tuple) else (out,)) if isinstance(a, mx.array)]
        if self._stale is None:
            self._built += 1
            if self.overlap_every and self._built % self.overlap_every == 0:
                mx.async_eval(arrays)
            return
        mx.eval(arrays)
        self.layers_done += 1
        if self.pause_s:
            time.sleep(self.pause_s)
        if self._stale():
            raise Abandoned(f"a RESET arrived after {self.layers_done} layers of the step")


__all__ = ["INTERRUPTIBLE_TOKENS", "OVERLAP_EVERY", "Abandoned", "LayerChecks", "overlap_for"]
