"""The coordinator's side of speculative decoding: what a request drafts, and what its passes accepted.

The scheduler thread (`pipeline.Pipeline`) owns this state with everything else. A request that
may speculate (`_Active.lookup`) drafts tokens for its next step, up to its adaptive length
(`drafting.DraftLength`): by prompt lookup (`drafting.Lookup`), or, where the sequence repeats
nothing, with the cluster's draft model (`draft_model.DraftModel`). The last stage verifies them
and sends the accepted ones plus one as a RUN of RESULTs (engine/stage/speculate.py). Drafting starts once
every stage's PONG said its caches roll back exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from orchestrator.engine.coordinator.links import StageLink
from orchestrator.engine.coordinator.metrics import Metrics

if TYPE_CHECKING:
    from orchestrator.engine.coordinator.draft_model import DraftModel
    from orchestrator.engine.coordinator.pipeline import _Active


def drafts_now(members: int, active: int, alone_only: bool = True) -> bool:
    """Whether a step of `members` requests, with `active` requests admitted in all, drafts.

    Only a request alone in the whole pipeline drafts: with others in flight (decoding in another
    micro-batch, or prefilling) the stages are busy anyway, so a verification chunk only takes their
    time from the others; speculation is the way to make ONE request faster. Drafting in every step
    at 4 concurrent requests halved the aggregate, and a request that drafted while alone in its
    micro-batch (its first step while the others still prefilled) cost 3-16 % of it
    (docs/benchmark.md). `alone_only=False`: every step may draft (tests mixing both kinds)."""
    return not alone_only or (members == 1 and active == 1)


class Speculating:
    """Mixin of `pipeline.Pipeline`: drafting and the accounting of verification passes."""

    links: list[StageLink]
    metrics: Metrics
    context_length: int
    _stats: dict[int, dict]
    _active: dict[int, "_Active"]
    _passes: dict[int, list[int]]  # request -> [drafted, RESULTs received] of its pass in flight
    draft_source: Callable[[list[int], int], list[int]] | None
    drafter: "DraftModel | None"

    def _speculation_possible(self) -> bool:
        """Every stage reported caches that roll back exactly (their PONG stats, engine/stage/speculate.py)."""
        return len(self._stats) == len(self.links) and all(st.get("speculation") for st in self._stats.values())

    def _draft(self, a: _Active) -> list[int]:
        """The tokens `a` drafts this step: prompt lookup, at most its adaptive length, never past
        max_tokens or the context (a pass emits drafts + 1)."""
        if a.lookup is None or a.length is None or not self._speculation_possible():
            return []
        room = min(a.length.next(), a.gen.params.max_tokens - a.generated - 1, self.context_length - a.position - 2)
        if room <= 0:
            return []
        if self.draft_source is not None:
            return self.draft_source(a.lookup.tokens, room)[:room]
        found = a.lookup.draft(room)
        if found or self.drafter is None:
            return found
        # Prompt lookup found nothing the request repeats: the draft model drafts (it costs a forward per
        # token on this thread; a repeat is free and, on code edits, accepted more often).
        return self.drafter.draft(a.rid, a.lookup.tokens, room)

    def _end_pass(self, rid: int) -> None:
        """A verification pass came back whole: count it, adapt the request's draft length."""
        passing = self._passes.pop(rid, None)
        if passing is None:
            return
        drafted, accepted = passing[0], passing[1] - 1
        self.metrics.observe_pass(drafted, accepted)
        a = self._active.get(rid)
        if a is not None and a.length is not None:
            a.length.observe(drafted, accepted)


__all__ = ["Speculating", "drafts_now"]
