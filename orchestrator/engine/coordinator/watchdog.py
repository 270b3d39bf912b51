"""Wedge detection for the coordinator: is a stage still making progress?

A stage's reader threads answer pings even when its compute thread is stuck, so liveness
alone cannot tell a wedged stage from a busy one. Every PONG therefore carries the stage's
progress (`stage_stats.progress_json`: steps completed, time in the current step, the request and
chunk it works on, work queued). The scheduler feeds each PONG to a `Watchdog`, which says a
stage is wedged when

* it has been inside one step for longer than the stall timeout (a legitimate prefill chunk
  takes a few seconds; the default timeout is several times that), or
* it has work queued and completed no step for the stall timeout, or
* an idle-time canary (one token through every stage) did not come back within the stall
  timeout: the culprit is the first stage whose step counter did not move since it was sent.

Owned by the scheduler thread; no I/O, no clock of its own (every call takes `t`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator import settings

ENV_STALL = settings.STALL_TIMEOUT_S.name
ENV_CANARY = settings.CANARY_INTERVAL_S.name
DEFAULT_STALL_TIMEOUT = 15.0  # well under 30 s; a 2048-token prefill chunk of SmolLM2 takes ~2-3 s here
DEFAULT_CANARY_INTERVAL = settings.CANARY_INTERVAL_S.default  # idle seconds before a canary


def stall_timeout(configured: float | None = None) -> float:
    """The stall timeout: `$PIPESERVE_STALL_TIMEOUT_S` (tests), else the cluster's, else the default."""
    return settings.STALL_TIMEOUT_S.read() or configured or DEFAULT_STALL_TIMEOUT


def canary_interval() -> float:
    """Idle time before a canary: `$PIPESERVE_CANARY_INTERVAL_S` or the default."""
    return settings.CANARY_INTERVAL_S.read()


@dataclass
class _Seen:
    steps: int = -1
    waiting_since: float | None = None  # work queued and no step completed since then
    progress: dict = field(default_factory=dict)


class Watchdog:
    """Per-stage progress bookkeeping and the verdict "wedged, because ..."."""

    def __init__(self, stages: int, timeout: float) -> None:
        self.timeout = timeout
        self._seen = [_Seen() for _ in range(stages)]
        self.canary_sent_at: float | None = None
        self._canary_steps: list[int] = []

    def observe(self, index: int, progress: dict, t: float) -> None:
        """A PONG's progress document from stage `index`."""
        seen = self._seen[index]
        steps = int(progress.get("steps", 0))
        queued = int(progress.get("queued") or 0)
        if steps != seen.steps or not queued:
            seen.waiting_since = t if queued else None
        elif seen.waiting_since is None:
            seen.waiting_since = t
        seen.steps = steps
        seen.progress = dict(progress)

    def forget(self, index: int) -> None:
        """The stage's connection is gone: a new process starts from scratch."""
        self._seen[index] = _Seen()
        self.canary_sent_at = None

    def last_progress(self, index: int) -> dict:
        """The stage's last progress report (empty before the first)."""
        return dict(self._seen[index].progress)

    def wedged(self, index: int, t: float) -> str:
        """Why stage `index` is wedged, or "" when it is making progress."""
        seen = self._seen[index]
        p = seen.progress
        if not p:
            return ""
        busy = float(p.get("busy_s") or 0.0)
        if busy > self.timeout:
            chunk = p.get("chunk") or [0, 0]
            return (f"no progress for {busy:.1f} s inside one step (request {p.get('request')}, "
                    f"{chunk[1]} token(s) at position {chunk[0]}, batch of {p.get('batch')})")
        if seen.waiting_since is not None and t - seen.waiting_since > self.timeout:
            return (f"{p.get('queued')} item(s) queued and no step completed for "
                    f"{t - seen.waiting_since:.1f} s")
        return ""

    # --- canary --------------------------------------------------------------------------
    def canary_sent(self, t: float) -> None:
        """A canary left the coordinator now."""
        self.canary_sent_at = t
        self._canary_steps = [s.steps for s in self._seen]

    def canary_returned(self) -> None:
        """The canary came back: the whole pipeline computes."""
        self.canary_sent_at = None

    def canary_overdue(self, t: float) -> tuple[int, str] | None:
        """(stage index, reason) when the canary has been out longer than the timeout."""
        if self.canary_sent_at is None or t - self.canary_sent_at <= self.timeout:
            return None
        waited = t - self.canary_sent_at
        stuck = next((i for i, (s, before) in enumerate(zip(self._seen, self._canary_steps)) if s.steps <= before),
                     len(self._seen) - 1)
        return stuck, f"the idle canary did not come back within {waited:.1f} s (it stopped at this stage)"


__all__ = ["Watchdog", "canary_interval", "stall_timeout"]
