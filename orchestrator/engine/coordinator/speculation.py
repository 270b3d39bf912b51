"""The coordinator's side of speculative decoding: what a request drafts, and what its passes accepted.

Owned by the scheduler thread (`pipeline.Pipeline`). A request that may speculate (`Active.lookup`)
drafts tokens for its next step, up to its adaptive length (`drafting.DraftLength`): by prompt lookup
(`drafting.Lookup`), or, where the sequence repeats nothing, with the cluster's draft model
(`draft_model.DraftModel`). The last stage verifies them and sends the accepted ones plus one as a RUN
of RESULTs (engine/stage/speculate.py). Drafting starts once every stage's PONG said its caches roll
back exactly.
"""

from __future__ import annotations

from typing import Callable

from orchestrator.engine.coordinator.draft_model import DraftModel
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.requests import Active


def drafts_now(members: int, active: int, alone_only: bool = True) -> bool:
    """Whether a step of `members` requests, with `active` requests admitted in all, drafts.

    Only a request alone in the whole pipeline drafts: with others in flight (decoding in another
    micro-batch, or prefilling) the stages are busy anyway, so a verification chunk only takes their
    time from the others; speculation is the way to make ONE request faster. Drafting in every step
    at 4 concurrent requests halved the aggregate, and a request that drafted while alone in its
    micro-batch (its first step while the others still prefilled) cost 3-16 % of it
    (docs/benchmark.md). `alone_only=False`: every step may draft (tests mixing both kinds)."""
    return not alone_only or (members == 1 and active == 1)


class Speculation:
    """Drafting and the accounting of verification passes, for the scheduler thread."""

    def __init__(self, metrics: Metrics, context_length: int, stage_stats: Callable[[], list[dict]]) -> None:
        self.metrics = metrics
        self.context_length = context_length
        self._stage_stats = stage_stats  # every connected stage's last PONG (what its caches can do)
        self._passes: dict[int, list[int]] = {}  # request -> [drafted, RESULTs received] of its pass in flight
        # (sequence so far, k) -> draft; None: prompt lookup. Tests set an oracle here before submitting,
        # to drive verification through chosen accepts and rejections.
        self.draft_source: Callable[[list[int], int], list[int]] | None = None
        # The cluster's draft model (main.py loads it): drafts instead of prompt lookup; this thread runs it.
        self.drafter: DraftModel | None = None
        # Draft only for a request alone in the pipeline (drafts_now). Tests turn it off to drive steps
        # that mix speculating and plain requests.
        self.alone_only = True

    def possible(self) -> bool:
        """Every stage reported caches that roll back exactly (their PONG stats, engine/stage/speculate.py)."""
        stats = self._stage_stats()
        return bool(stats) and all(st.get("speculation") for st in stats)

    def draft(self, a: Active, members: int, active: int) -> list[int]:
        """The tokens `a` drafts in a step of `members` requests (of `active` admitted): prompt lookup,
        at most its adaptive length, never past max_tokens or the context (a pass emits drafts + 1).
        A pass it drafts for is counted from here (`result`, `pass_returned`)."""
        if (a.lookup is None or a.length is None or not drafts_now(members, active, self.alone_only)
                or not self.possible()):
            return []
        room = min(a.length.next(), a.gen.params.max_tokens - a.generated - 1, self.context_length - a.position - 2)
        if room <= 0:
            return []
        if self.draft_source is not None:
            drafted = self.draft_source(a.lookup.tokens, room)[:room]
        else:
            drafted = a.lookup.draft(room)
            if not drafted and self.drafter is not None:
                # Prompt lookup found nothing the request repeats: the draft model drafts (a forward per
                # token on this thread; a repeat is free and, on code edits, accepted more often).
                drafted = self.drafter.draft(a.rid, a.lookup.tokens, room)
        if drafted:
            self._passes[a.rid] = [len(drafted), 0]
        return drafted

    def result(self, rid: int) -> None:
        """One RESULT of the request's pass in flight arrived."""
        passing = self._passes.get(rid)
        if passing is not None:
            passing[1] += 1

    def pass_returned(self, rid: int, a: Active | None) -> None:
        """A verification pass came back whole: count it, adapt the request's draft length."""
        passing = self._passes.pop(rid, None)
        if passing is None:
            return
        drafted, accepted = passing[0], passing[1] - 1
        self.metrics.observe_pass(drafted, accepted)
        if a is not None and a.length is not None:
            a.length.observe(drafted, accepted)

    def forget(self, rid: int) -> None:
        """The request ended: the draft model drops its state for it."""
        if self.drafter is not None:
            self.drafter.forget(rid)

    def clear(self) -> None:
        """Every request is gone (a lost stage, shutdown)."""
        self._passes.clear()


__all__ = ["Speculation", "drafts_now"]
