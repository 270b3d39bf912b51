"""Small live charts as inline SVG sparklines (pure): geometry only, no chart library.

The watcher posts a sample only when a value changed, so a value holds until the next
sample: the line is drawn as steps (across, then up or down), which stays honest over
idle gaps. The x axis is the last `WINDOW_S` seconds up to the newest sample; a value from
before the window is carried in from the left edge.
"""

from __future__ import annotations

from typing import Any, Sequence

from orchestrator.control.rules.state import Session

WINDOW_S = 30.0
WIDTH, HEIGHT, PAD = 200.0, 40.0, 3.0

Point = tuple[float, float | None]  # (time in seconds, value or None for "unknown")


def _n(v: float) -> str:
    """A compact SVG coordinate."""
    text = f"{v:.1f}"
    return text[:-2] if text.endswith(".0") else text


def sparkline(points: Sequence[Point], *, end: float | None = None, window_s: float = WINDOW_S,
              width: float = WIDTH, height: float = HEIGHT, pad: float = PAD, min_top: float = 1.0) -> dict[str, Any]:
    """Step-line and area paths for `points` (sorted by time) in a width×height box.

    Returns width, height, `line` and `area` (SVG path data, empty when nothing is known),
    `latest` (the newest value), `peak` (the highest value shown), `top` (the value at the
    top edge: the peak, at least `min_top`) and `empty`.
    """
    pts = sorted(points, key=lambda p: p[0])
    if not pts:
        return {"width": width, "height": height, "line": "", "area": "", "latest": None, "peak": None,
                "top": min_top, "empty": True}
    end = pts[-1][0] if end is None else end
    start = end - window_s
    before = [p for p in pts if p[0] < start]
    shown: list[Point] = ([(start, before[-1][1])] if before else []) + [p for p in pts if start <= p[0] <= end]
    values = [v for _, v in shown if v is not None]
    peak = max(values) if values else None
    top = max(peak or 0.0, min_top)
    base = height - pad

    def xy(p: Point) -> tuple[float, float]:
        x = (p[0] - start) / window_s * width
        return x, pad + (height - 2 * pad) * (1 - max(0.0, p[1] or 0.0) / top)

    runs: list[list[tuple[float, float]]] = []
    open_run = False
    for p in shown:
        x = (p[0] - start) / window_s * width
        if p[1] is None:
            if open_run and runs[-1][-1][0] < x:
                runs[-1].append((x, runs[-1][-1][1]))  # a value holds until it becomes unknown
            open_run = False
            continue
        if not open_run:
            runs.append([])
            open_run = True
        runs[-1].append(xy(p))
    if open_run and runs[-1][-1][0] < width:
        runs[-1].append((width, runs[-1][-1][1]))  # the newest value holds until the window's end
    line, area = [], []
    for run in runs:
        steps = "".join(f" H{_n(x)} V{_n(y)}" for x, y in run[1:])
        (x0, y0), xn = run[0], run[-1][0]
        line.append(f"M{_n(x0)} {_n(y0)}{steps}")
        area.append(f"M{_n(x0)} {_n(base)} V{_n(y0)}{steps} H{_n(xn)} V{_n(base)} Z")
    return {"width": width, "height": height, "line": " ".join(line), "area": " ".join(area),
            "latest": pts[-1][1], "peak": peak, "top": top, "empty": not runs}


def _label(value: float | None, unit: str) -> str:
    return "–" if value is None else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


def throughput_chart(s: Session) -> dict[str, Any]:
    """Tokens/s over the last WINDOW_S seconds of a session's samples."""
    chart = sparkline([(x.at, x.tokens_per_s) for x in s.samples], min_top=1.0)
    now, peak = _label(chart["latest"], "tokens/s"), _label(chart["peak"], "tokens/s")
    return {**chart, "now": now, "peak_text": peak,
            "aria": f"tokens per second over the last {WINDOW_S:.0f} s: now {now}, peak {peak}"}


def step_chart(s: Session, index: int) -> dict[str, Any]:
    """Stage `index`'s step latency (ms) over the last WINDOW_S seconds of samples."""
    points = [(x.at, x.step_ms[index] if index < len(x.step_ms) else None) for x in s.samples]
    chart = sparkline(points, min_top=0.1, width=160.0, height=32.0)
    now, peak = _label(chart["latest"], "ms"), _label(chart["peak"], "ms")
    return {**chart, "now": now, "peak_text": peak,
            "aria": f"stage {index} step latency over the last {WINDOW_S:.0f} s: now {now}, peak {peak}"}
