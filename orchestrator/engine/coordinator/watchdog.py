"""Wedge detection for the coordinator: is a stage still making progress?

A stage's reader threads answer pings even when its compute thread is stuck, so liveness
alone cannot tell a wedged stage from a busy one. Every PONG therefore carries the stage's
progress (`stage/stats.progress_json`: steps completed, layers done inside a long step, time in
the current step, work queued, its slowest recent step). The scheduler feeds each PONG to a
`Watchdog`. A wedge is **no progress while work waits**: a stage is wedged when it has work (a
step under way or frames queued) and neither its step counter nor its layer counter has moved for
its allowance — the stall timeout, or SLOW_FACTOR times the slowest of its recent steps when that
is longer. A stage on a loaded machine that takes seconds per step is slow, not stuck: its counters
move, and its allowance grows with the step times it has shown. A stage that moves again after
being judged wedged has `recovered` (the pipeline re-probes it and serves again on its own).

An idle-time canary (one token through every stage) proves an idle pipeline still computes: it
is work like any other, so a stage it stops at is caught by the rule above. A canary still out past
every stage's allowance is blamed on a stage only when that stage has not moved since the canary
left (slow stages that moved are not blamed).

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


SLOW_FACTOR = 4.0  # a stage's allowance is at least this many times its slowest recent step


@dataclass
class _Seen:
    counters: tuple[int, int] = (-1, -1)  # (steps completed, layers done in the current step)
    moved_at: float | None = None  # when the counters last moved, or the stage last had no work
    progress: dict = field(default_factory=dict)
    wedged_at: tuple[int, int] | None = None  # the counters when it was judged wedged


def _has_work(progress: dict) -> bool:
    return float(progress.get("busy_s") or 0.0) > 0 or int(progress.get("queued") or 0) > 0


class Watchdog:
    """Per-stage progress bookkeeping and the verdicts "wedged, because ..." and "recovered"."""

    def __init__(self, stages: int, timeout: float) -> None:
        self.timeout = timeout
        self._seen = [_Seen() for _ in range(stages)]
        self.canary_sent_at: float | None = None
        self._canary_counters: list[tuple[int, int]] = []

    def observe(self, index: int, progress: dict, t: float) -> None:
        """A PONG's progress document from stage `index`."""
        seen = self._seen[index]
        counters = (int(progress.get("steps", 0)), int(progress.get("layers") or 0))
        waiting_before = seen.moved_at is not None and _has_work(seen.progress)
        if counters != seen.counters or not _has_work(progress) or not waiting_before:
            # inside a step no layer of which is done yet, the last movement was when that step began
            seen.moved_at = t - (float(progress.get("busy_s") or 0.0) if counters[1] == 0 else 0.0)
        seen.counters = counters
        seen.progress = dict(progress)

    def forget(self, index: int) -> None:
        """The stage's connection is gone: a new process starts from scratch."""
        self._seen[index] = _Seen()
        self.canary_sent_at = None

    def last_progress(self, index: int) -> dict:
        """The stage's last progress report (empty before the first)."""
        return dict(self._seen[index].progress)

    def allowance(self, index: int) -> float:
        """How long stage `index` may show no progress while work waits: the stall timeout, or
        SLOW_FACTOR times its slowest recent step when that is longer."""
        slowest_s = float(self._seen[index].progress.get("slowest_ms") or 0.0) / 1000
        return max(self.timeout, SLOW_FACTOR * slowest_s)

    def wedged(self, index: int, t: float) -> str:
        """Why stage `index` is wedged (remembered for `recovered`), or "" while it makes progress."""
        seen = self._seen[index]
        p = seen.progress
        if not p or not _has_work(p) or seen.moved_at is None:
            return ""
        still, allowed = t - seen.moved_at, self.allowance(index)
        if still <= allowed:
            return ""
        seen.wedged_at = seen.counters
        limit = f"its allowance is {allowed:.1f} s"
        if float(p.get("busy_s") or 0.0) > 0:
            chunk = p.get("chunk") or [0, 0]
            return (f"no progress for {still:.1f} s inside one step (request {p.get('request')}, "
                    f"{chunk[1]} token(s) at position {chunk[0]}, batch of {p.get('batch')}; {limit})")
        return f"{p.get('queued')} item(s) queued and no step completed for {still:.1f} s ({limit})"

    def recovered(self, index: int) -> bool:
        """Whether a stage judged wedged has moved since (or has no work left): it computes again."""
        seen = self._seen[index]
        if seen.wedged_at is None or not seen.progress:
            return False
        if seen.counters != seen.wedged_at or not _has_work(seen.progress):
            seen.wedged_at = None
            return True
        return False

    # --- canary --------------------------------------------------------------------------
    def canary_sent(self, t: float) -> None:
        """A canary left the coordinator now."""
        self.canary_sent_at = t
        self._canary_counters = [s.counters for s in self._seen]

    def canary_returned(self) -> None:
        """The canary came back: the whole pipeline computes."""
        self.canary_sent_at = None

    def canary_overdue(self, t: float) -> tuple[int, str] | None:
        """(stage index, reason) when the canary has been out longer than every stage's allowance
        together and a stage has not moved since it left; None while every stage moved (slow, not stuck)."""
        if self.canary_sent_at is None:
            return None
        waited = t - self.canary_sent_at
        if waited <= sum(self.allowance(i) for i in range(len(self._seen))):
            return None
        stuck = next((i for i, (s, before) in enumerate(zip(self._seen, self._canary_counters))
                      if s.counters == before), None)
        if stuck is None:
            return None
        self._seen[stuck].wedged_at = self._seen[stuck].counters
        return stuck, f"the idle canary did not come back within {waited:.1f} s (it stopped at this stage)"


__all__ = ["SLOW_FACTOR", "Watchdog", "canary_interval", "stall_timeout"]
