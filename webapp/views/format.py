"""Small formatting helpers shared by view models (pure)."""

from __future__ import annotations

from orchestrator.agent.schemas import ModelInfo


def size(n: float | int | None) -> str:
    """Bytes as a short human string: 1.5 GB, 300 MB."""
    if n is None:
        return "–"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") or value >= 100 else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def rate(bps: float | None) -> str:
    """Bytes per second as MB/s."""
    return "–" if not bps else f"{bps / 1e6:.1f} MB/s"


def percent(done: int, total: int) -> int:
    """0..100, safe for total 0."""
    return 100 if total <= 0 else max(0, min(100, round(100 * done / total)))


def unsupported_text(model: ModelInfo) -> str:
    """"Unsupported: <reason>" for a model the engine cannot serve ("" when it can): the support
    registry's reason, else why the directory is not a usable MLX model."""
    if model.supported:
        return ""
    return f"Unsupported: {model.unsupported_reason or model.reason or 'not an MLX model directory'}"
