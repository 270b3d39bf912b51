"""What became of the answers held across a lost stage: the coordinator's record of its last pause.

When a stage is lost the scheduler holds every answer in flight (`Pipeline._hold_all`) and, once the
pipeline is ready again, resumes each (docs/recovery.md, "Answers in flight pause and resume"). A
*pause* is one such episode: from the first hold until every held answer has either caught up with
what its client had (resumed) or ended without it (lost: a token that differed, the deadline, its
client gone, the coordinator stopping). A stage lost again while answers still resume extends the
same pause (they are held again, and counted once).

`Pauses` is owned by the scheduler thread; after each change it publishes an immutable
`PauseRecord` (one attribute assignment), which `/health` reports as `pause` (`health_report.PauseReport`)
so the control plane can show a recovery's "3 requests resumed, 0 lost" and how long it took.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PauseRecord:
    """One pause as `/health` reports it; times are on the coordinator's monotonic clock (`links.now`)."""

    id: str  # random: the control plane never reports one pause for two faults
    since: float  # the first hold
    held: int  # distinct answers held
    resumed: int
    lost: int
    ready_at: float | None = None  # the pipeline was ready again and the first resume began
    settled_at: float | None = None  # every held answer resumed or lost

    def report(self, t: float) -> dict:
        """The `/health` member at time `t`: seconds since the hold, and the durations from it."""
        return {"id": self.id, "age_s": round(t - self.since, 3), "held": self.held, "resumed": self.resumed,
                "lost": self.lost, "settled": self.settled_at is not None,
                "ready_s": None if self.ready_at is None else round(self.ready_at - self.since, 3),
                "seconds": None if self.settled_at is None else round(self.settled_at - self.since, 3)}


@dataclass
class Pauses:
    """The last pause, kept by the scheduler thread; `record` is what other threads read."""

    record: PauseRecord | None = None
    _open: set[int] = field(default_factory=set)  # id() of the held or resuming answers' Generations

    def held(self, gen: object, t: float) -> None:
        """An answer is held (again): a new pause unless one is still open."""
        r = self.record
        if r is None or r.settled_at is not None:
            r = PauseRecord(os.urandom(6).hex(), t, 0, 0, 0)
            self._open.clear()
        if id(gen) not in self._open:
            self._open.add(id(gen))
            r = PauseRecord(r.id, r.since, r.held + 1, r.resumed, r.lost, r.ready_at)
        self.record = r

    def resuming(self, t: float) -> None:
        """The pipeline is ready again: the held answers start over (the first time marks `ready_at`)."""
        r = self.record
        if r is not None and self._open and r.ready_at is None:
            self.record = PauseRecord(r.id, r.since, r.held, r.resumed, r.lost, t)

    def resumed(self, gen: object, t: float) -> None:
        """An answer caught up with what its client had: it goes on."""
        self._end(gen, t, resumed=True)

    def lost(self, gen: object, t: float) -> None:
        """An answer of the pause ended without resuming (nothing when it is none of the pause's)."""
        self._end(gen, t, resumed=False)

    def _end(self, gen: object, t: float, resumed: bool) -> None:
        r = self.record
        if r is None or id(gen) not in self._open:
            return
        self._open.discard(id(gen))
        self.record = PauseRecord(r.id, r.since, r.held, r.resumed + resumed, r.lost + (not resumed), r.ready_at,
                                  None if self._open else t)


__all__ = ["PauseRecord", "Pauses"]
