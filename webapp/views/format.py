"""Small formatting helpers shared by view models (pure)."""

from __future__ import annotations

from orchestrator.agent.schemas import ModelInfo
from orchestrator.units import format_bytes, format_rate


def size(n: float | int | None) -> str:
    """Bytes in binary units, as everywhere (orchestrator.units): 1.07 GiB, 300 MiB; "–" if unknown."""
    return "–" if n is None else format_bytes(n)


def rate(bps: float | None) -> str:
    """Bytes per second in the same units: 11.9 MiB/s ("–" before the first measurement)."""
    return "–" if not bps else format_rate(bps)


def percent(done: int, total: int) -> int:
    """0..100, safe for total 0."""
    return 100 if total <= 0 else max(0, min(100, round(100 * done / total)))


def unsupported_text(model: ModelInfo) -> str:
    """"Unsupported: <reason>" for a model the engine cannot serve ("" when it can): the support
    registry's reason, else why the directory is not a usable MLX model."""
    if model.supported:
        return ""
    return f"Unsupported: {model.unsupported_reason or model.reason or 'not an MLX model directory'}"


def duration(seconds: float | None) -> str:
    """Time left as "45 s", "3 min 20 s", "1 h 5 min" ("–" when unknown)."""
    if seconds is None:
        return "–"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
