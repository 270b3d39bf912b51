"""Abandoning a long step between layers: a RESET read while a prefill chunk computes ends it there.

MLX evaluates a step's graph in one go, so a stage computing a long prefill chunk could not look
at anything else until the chunk was done (seconds on a slow BLAS): after a stage was lost, the
survivors' RESET and the recovery's readiness probe waited behind the chunks of requests that
were being dropped anyway. A step of at least INTERRUPTIBLE_TOKENS positions is therefore
evaluated layer by layer (`stand_ins.Checkpoint` around each layer the stage runs: the same
operations, so the same results), and after each layer the stage asks whether a RESET has been
read since the step's frames were. If so the step stops with `Abandoned`; its requests (their
caches now half-advanced) are dropped by that RESET, which the stage handles next.

Every other step is evaluated whole, synchronously (`mx.eval`): a stage never evaluates
asynchronously. It used to start `mx.async_eval` every 4 layers, to overlap compute with building
the rest of the graph (~8 % at one BLAS thread of two cores), and stages then hung for good at start
on loaded machines: the compute thread waited inside mlx's `eval_impl` (its throttle of asynchronous
work, `scheduler::wait_for_one`, which waits on a process-wide count of outstanding tasks until it
falls) while mlx's stream thread sat idle, so nothing could lower it. Liveness is worth more than
those 8 % (docs/benchmark.md, "Liveness").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

INTERRUPTIBLE_TOKENS = 16  # positions in one step from which it is evaluated layer by layer
LAYER_PAUSE_S = 0.5  # the test fault `layer-pause`: a pause after each layer of an interruptible step


class Abandoned(Exception):
    """A step stopped between two layers: a RESET was read while it computed."""


class LayerChecks:
    """Owned by the MLX thread: whether the step now computing is interruptible, and how to tell."""

    def __init__(self) -> None:
        self._stale: Callable[[], bool] | None = None
        self.pause_s = 0.0  # > 0 only under the `layer-pause` fault (faults.py)
        self.layers_done = 0  # layers evaluated one by one in the current step (read by PONGs: progress)

    @contextmanager
    def interruptible(self, stale: Callable[[], bool]) -> Iterator[None]:
        """Evaluate the layers called inside this block one by one, asking `stale()` after each."""
        self._stale, self.layers_done = stale, 0
        try:
            yield
        finally:
            self._stale = None

    def after_layer(self, out: Any) -> None:
        """Called by each wrapped layer with its output: inside an interruptible step, evaluate it, then
        stop if the step is stale; outside one, nothing (the step is evaluated whole)."""
        if self._stale is None:
            return
        mx.eval([a for a in (out if isinstance(out, tuple) else (out,)) if isinstance(a, mx.array)])
        self.layers_done += 1
        if self.pause_s:
            time.sleep(self.pause_s)
        if self._stale():
            raise Abandoned(f"a RESET arrived after {self.layers_done} layers of the step")


__all__ = ["INTERRUPTIBLE_TOKENS", "Abandoned", "LayerChecks"]
