"""Which rows of a family × variant matrix a test run checks.

The matrices (every served family × formats, cached-prefix scenarios, quantizations) are over a
thousand rows; `make test` checks every family and every variant, not every pair: family k gets
variant k mod len(variants), so each family has a row and each variant runs on about
len(families) / len(variants) families, always the same ones (a failure reproduces). Families named
in `every` (the representative ones: plain attention, a sliding window, a hybrid recurrent stack,
MoE) get every variant. `PIPESERVE_FULL_MATRIX=1` (`make test-matrix`) checks every pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from orchestrator import settings

V = TypeVar("V")


def full() -> bool:
    """Whether this run checks every row (PIPESERVE_FULL_MATRIX=1)."""
    return settings.FULL_MATRIX.read() == "1"


def rows(families: Sequence[str], variants: Sequence[V], every: Iterable[str] = (),
         offset: int = 0) -> list[tuple[str, V]]:
    """The (family, variant) pairs this run checks, in a stable order; `offset` shifts which variant each
    family gets (two tests of the same variants, offset 0 and 1, give a family both)."""
    if not variants:
        return []
    keep_all = set(every)
    out = []
    for k, family in enumerate(families):
        for i, variant in enumerate(variants):
            if full() or family in keep_all or i == (k + offset) % len(variants):
                out.append((family, variant))
    return out


def sample(families: Sequence[str], every: Iterable[str] = (), stride: int = 4) -> list[str]:
    """Every `stride`-th family plus those in `every` (all of them with PIPESERVE_FULL_MATRIX=1), for a
    check that repeats one already made per family elsewhere."""
    keep_all = set(every)
    return [f for k, f in enumerate(families) if full() or f in keep_all or k % stride == 0]
