"""Small numeric helpers of the report: ratios of rounds, NaN-aware medians, formatting."""

from __future__ import annotations

import statistics


def median(xs: list[float]) -> float:
    """Median of the numbers that are not NaN (NaN when none is)."""
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def fmt(x: float | None, digits: int = 2) -> str:
    """A number with `digits` decimals, or n/a."""
    return "n/a" if x is None or x != x else f"{x:.{digits}f}"


def mib(x: int | None) -> str:
    """Bytes as whole MiB, or n/a."""
    return "n/a" if not x else f"{x / 2**20:.0f}"


def best_ratio(a: list[float], b: list[float], lower_is_better: bool = False) -> float:
    """Ratio of the best round of a to the best round of b (noise from other users only ever
    slows a measurement down, so each system's best round is its least disturbed one)."""
    a, b = [x for x in a if x == x], [x for x in b if x == x]
    if not a or not b:
        return float("nan")
    pick = min if lower_is_better else max
    return pick(a) / pick(b)


def paired_ratio(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a[i]/b[i] (both measured in the same round)."""
    return [x / y for x, y in zip(a, b) if y and x == x and y == y]


def spread(xs: list[float], digits: int = 2) -> str:
    """Median (min–max) of the rounds, or the one value."""
    xs = [x for x in xs if x == x]
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return fmt(xs[0], digits)
    return f"{fmt(median(xs), digits)} ({fmt(min(xs), digits)}–{fmt(max(xs), digits)})"
