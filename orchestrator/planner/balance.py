"""Choosing cut points: contiguous ranges, one per node in order, minimizing the worst stage.

Two objectives share one dynamic programme over (stage, end layer):
- `balanced_split`: the stage whose per-token bytes are largest relative to its node's free
  memory is as light as possible (a node with twice the free memory takes about twice the
  work), among the splits where every stage fits its node (within a fill limit);
- `fullest_split`: the fullest node (weights + KV + overhead over free memory) is as empty as
  possible; used to show the closest attempt when nothing fits.
Costs grow when a stage gains layers, so each inner loop stops as soon as a longer stage can
no longer win: fast enough for hundreds of layers and a handful of nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

from orchestrator.planner.memory import StageCosts

Split = tuple[tuple[int, int], ...]  # inclusive (first, last) per stage
# cost(stage, start, end) of layers [start, end); math.inf when the stage may not take them.
CostFn = Callable[[int, int, int], float]


def min_max_split(num_layers: int, num_stages: int, cost: CostFn,
                  refused: Collection[int] = ()) -> Split | None:
    """Contiguous split of `num_layers` into `num_stages` non-empty ranges minimizing the
    largest cost, or None when every split has an infinite cost. No stage starts at a layer
    in `refused` (a boundary the engine would refuse: `ModelDescription.refused_boundaries`).

    `cost` must not decrease when a range grows at its start (what keeps the early exit
    exact). Ties go to the split found first (earlier stages take fewer layers), so the
    answer is deterministic.
    """
    if not 1 <= num_stages <= num_layers:
        return None
    # best[j]: the smallest worst cost of layers [0, j) over the stages placed so far;
    # back[k][j]: where stage k starts in that optimum.
    best = [math.inf] * (num_layers + 1)
    best[0] = 0.0
    back: list[list[int]] = []
    for k in range(num_stages):
        nxt = [math.inf] * (num_layers + 1)
        starts = [-1] * (num_layers + 1)
        last = k == num_stages - 1
        # Every later stage needs at least one layer.
        lo_end, hi_end = k + 1, num_layers - (num_stages - 1 - k)
        for end in (num_layers,) if last else range(lo_end, hi_end + 1):
            for start in range(end - 1, k - 1, -1) if k else (0,):
                if start in refused:
                    continue  # not a boundary (a longer stage past it may still win)
                c = cost(k, start, end)
                if c == math.inf or c >= nxt[end]:
                    break  # starting earlier only adds layers: never cheaper, never fits again
                worst = max(best[start], c)
                if worst < nxt[end]:
                    nxt[end], starts[end] = worst, start
        best = nxt
        back.append(starts)
    if best[num_layers] == math.inf:
        return None
    out: list[tuple[int, int]] = []
    end = num_layers
    for k in range(num_stages - 1, -1, -1):
        start = back[k][end]
        out.append((start, end - 1))
        end = start
    return tuple(reversed(out))


def balanced_split(costs: StageCosts, free_bytes: Sequence[int], fill: float = 1.0) -> Split | None:
    """The split spreading per-token bytes in proportion to free memory, every stage using at
    most `fill` of its node's free memory; None when no split does."""

    def cost(k: int, start: int, end: int) -> float:
        if costs.total_bytes(start, end, runs_coordinator=k == 0) > fill * free_bytes[k]:
            return math.inf
        return costs.token_bytes(start, end) / max(1, free_bytes[k])

    return min_max_split(costs.num_layers, len(free_bytes), cost, frozenset(costs.model.refused_boundaries))


def fullest_split(costs: StageCosts, free_bytes: Sequence[int]) -> Split | None:
    """The split whose fullest node is as empty as possible (fit fraction; may exceed 1)."""

    def cost(k: int, start: int, end: int) -> float:
        return costs.total_bytes(start, end, runs_coordinator=k == 0) / max(1, free_bytes[k])

    return min_max_split(costs.num_layers, len(free_bytes), cost, frozenset(costs.model.refused_boundaries))
