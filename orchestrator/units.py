"""Byte counts in words: the one formatting helper for sizes everywhere a person reads them.

Binary units throughout (1 KiB = 1024 B), the convention of memory budgets (`--memory-budget
1100M` means 1100 MiB), of the planner's messages and of the dashboard, so a number in a plan
refusal, a node toggle and the README can be compared as they stand.
"""

from __future__ import annotations

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: float | int) -> str:
    """Bytes as "850 B", "12.5 MiB", "513 MiB", "1.07 GiB" (negative values keep their sign).

    GiB and TiB keep two decimals (a node's budget differs from a stage's need in the second);
    KiB and MiB one decimal below 100, none above.
    """
    value = float(n)
    for unit in UNITS:
        if abs(value) < 1024 or unit == UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{value:.0f} B"
    if unit in ("GiB", "TiB"):
        return f"{value:.2f} {unit}"
    return f"{value:.1f} {unit}" if abs(value) < 100 else f"{value:.0f} {unit}"


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second in the same units: "11.9 MiB/s"."""
    return f"{format_bytes(bytes_per_s)}/s"
