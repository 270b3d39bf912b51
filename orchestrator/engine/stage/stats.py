"""What a stage says about itself: its statistics and the step it is computing (the PONG).

The MLX thread replaces these objects (never mutates them); reader threads answer a PING with
the latest ones without taking any lock, so a stage deep in a long prefill still proves it is
alive and shows how far it got — the coordinator's watchdog reads the progress part.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field

RECENT_STEPS = 32  # how many of its last steps a stage's "slowest step" covers


@dataclass
class StageStats:
    """Published by the MLX thread, read by reader threads (replaced, never mutated)."""

    stage: int
    layers: tuple[int, int]
    requests: int = 0
    steps: int = 0
    step_ms: float = 0.0
    batch: int = 0
    max_batch: int = 0
    rss_bytes: int = 0
    weight_bytes: int = 0
    extra: dict = field(default_factory=dict)
    slowest_ms: float = 0.0  # the longest of its last RECENT_STEPS steps: the watchdog's sense of "slow"
    batched_chunks: int = 0  # prefill chunks run in a batched forward (PIPESERVE_PREFILL_BATCH=batched)

    def as_json(self) -> dict:
        """The PONG payload."""
        return {
            "stage": self.stage, "layers": [self.layers[0], self.layers[1] - 1], "requests": self.requests,
            "steps": self.steps, "step_ms": round(self.step_ms, 3), "batch": self.batch,
            "max_batch": self.max_batch, "slowest_ms": round(self.slowest_ms, 3),
            "batched_chunks": self.batched_chunks,
            "rss_bytes": self.rss_bytes, "weight_bytes": self.weight_bytes, **self.extra,
        }


@dataclass(frozen=True)
class Progress:
    """The step the MLX thread is computing now (replaced, never mutated; None between steps)."""

    started: float  # time.monotonic() when the step began
    request: int  # the first request of the step
    position: int  # its KV position: where the chunk starts
    tokens: int  # the chunk's length (1 for a decode step)
    batch: int  # requests in the step


def progress_json(stats: StageStats, current: Progress | None, queued: int, at: float, layers: int = 0) -> dict:
    """What a PONG says about progress: the coordinator's watchdog reads it (pure). `layers`: layers
    evaluated so far in a step evaluated layer by layer (interrupt.py), progress inside one long step."""
    return {"steps": stats.steps, "busy_s": round(at - current.started, 3) if current else 0.0,
            "layers": layers if current else 0, "slowest_ms": round(stats.slowest_ms, 3),
            "request": current.request if current else None,
            "chunk": [current.position, current.tokens] if current else None,
            "batch": current.batch if current else 0, "queued": queued, "pid": os.getpid()}


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


__all__ = ["RECENT_STEPS", "Progress", "StageStats", "progress_json", "rss_bytes"]
