"""The requests in flight on the coordinator: each one's progress, and the micro-batches they travel in.

Owned by the scheduler thread (`pipeline.Pipeline`), which admits, steps and finishes them; this
module only keeps the book: who is active, who is ready for its next decode step, and which
micro-batch groups are still out (at most one per stage, so every stage works on a different one).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field

from orchestrator.engine.coordinator.drafting import DraftLength, Lookup
from orchestrator.engine.coordinator.generation import Generation
from orchestrator.engine.coordinator.prefix_index import Reuse
from orchestrator.engine.wire import Frame


@dataclass
class Active:
    """One request in flight, as the scheduler tracks it."""

    gen: Generation
    rid: int
    position: int = 0
    generated: int = 0
    next_token: int = 0
    cancelled: bool = False
    internal: bool = False  # the readiness probe or the idle canary: never counted as a request
    canary: bool = False
    opened: Frame | None = None  # its OPEN frame, sent ahead of its first chunk
    tokens: list[int] | None = None  # generated so far (what a prompt-cache entry of it covers)
    reuse: Reuse | None = None  # the prompt-cache entry it started from
    lookup: Lookup | None = None  # its prompt and output, indexed for drafting (None: it never speculates)
    length: DraftLength | None = None  # how many tokens it drafts next
    replay: list[int] = field(default_factory=list)  # resumed: tokens the client has, to generate again first
    resumed: bool = False


@dataclass
class Held:
    """A request whose stage was lost: held until the pipeline is ready again, then resumed."""

    gen: Generation
    tokens: list[int]  # what the client has received
    since: float
    reason: str


class Book:
    """Active requests by id, the ready queue and the micro-batch groups still out."""

    def __init__(self) -> None:
        # Request ids start at a random base: a stage never confuses two sessions' requests.
        self._ids = itertools.count(int.from_bytes(os.urandom(3), "little") << 32)
        self.active: dict[int, Active] = {}
        self.ready: list[int] = []  # ids whose next decode step may go
        self._group_of: dict[int, int] = {}
        self.groups: dict[int, int] = {}  # group id -> members whose step is still out
        self._group_ids = itertools.count(1)
        self.held: list[Held] = []  # requests waiting, paused, for a lost stage's replacement

    def open(self, gen: Generation, internal: bool, canary: bool, reuse: Reuse | None) -> Active:
        """Track a new request under a fresh id."""
        a = Active(gen, next(self._ids), internal=internal, canary=canary, tokens=[], reuse=reuse)
        gen.rid = a.rid
        self.active[a.rid] = a
        return a

    def get(self, rid: int | None) -> Active | None:
        """The active request with this id, if any."""
        return self.active.get(rid) if rid is not None else None

    def close(self, rid: int) -> None:
        """It ended (its group's count is settled by `step_returned`)."""
        self.active.pop(rid, None)

    def public_count(self) -> int:
        """Requests in flight that count against max_requests (not the probe or a canary; held ones do)."""
        return sum(1 for a in self.active.values() if not a.internal) + len(self.held)

    def release(self, gen: Generation) -> bool:
        """Stop holding this request (its client left); whether it was held."""
        kept = [h for h in self.held if h.gen is not gen]
        found, self.held = len(kept) != len(self.held), kept
        return found

    def probe(self) -> Active | None:
        """The readiness probe's request in flight, if any."""
        return next((a for a in self.active.values() if a.internal and not a.canary), None)

    def only_canaries(self) -> bool:
        """Nothing but (at most) the idle canary is in flight: the pipeline is idle."""
        return all(a.canary for a in self.active.values())

    def launched(self, members: list[Active]) -> None:
        """These requests' step went out together as one group."""
        gid = next(self._group_ids)
        for a in members:
            self._group_of[a.rid] = gid
        self.groups[gid] = len(members)

    def step_returned(self, rid: int) -> None:
        """A request's step came back (its last RESULT, or an ERROR): its group has one fewer out."""
        gid = self._group_of.pop(rid, None)
        if gid is not None:
            self.groups[gid] -= 1
            if self.groups[gid] == 0:
                del self.groups[gid]

    def clear(self) -> list[Active]:
        """Forget every request (a lost stage, shutdown); returns those that were active."""
        gone = list(self.active.values())
        self.active.clear()
        self.ready.clear()
        self._group_of.clear()
        self.groups.clear()
        return gone


__all__ = ["Active", "Book", "Held"]
