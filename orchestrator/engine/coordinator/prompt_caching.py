"""The coordinator's prompt cache: which stages hold which KV entries, and the disk tier's files.

The scheduler thread (`pipeline.Pipeline`) owns this state with everything else; this module is
the half of it that keeps the prefix index (`prefix_index.PrefixIndex`) true to what the stages
hold: their acknowledgements index entries and evict over budget, a refused or missing entry is
forgotten on every stage, a lost or reconnected stage empties the whole index, and once ready
the files every stage still holds on disk are adopted back (a restarted stage comes back warm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.engine.coordinator.disk_adoption import DiskAdoption
from orchestrator.engine.coordinator.links import StageLink
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.prefix_index import PrefixIndex
from orchestrator.engine.wire import Frame, FrameError, Kind, json_frame
from orchestrator.logs import EventLogger


class PromptCaching:
    """Mixin of `pipeline.Pipeline`: the prompt-cache half of the scheduler thread."""

    links: list[StageLink]
    log: EventLogger
    metrics: Metrics
    cache: PrefixIndex
    _disk: bool  # the disk tier is on: saves carry their tokens, the stages write files
    _adoption: DiskAdoption

    if TYPE_CHECKING:  # supplied by the request half (pipeline.Pipeline); type-only, see liveness.py
        def _send(self, index: int, frames: list[Frame]) -> bool: ...

    def _on_cache_ack(self, index: int, f: Frame) -> None:
        """A stage stored (or could not store) a prompt-cache entry: index it, evict over budget."""
        try:
            ack = f.json()
            if "disk" in ack:
                self._adopt_files(index, ack["disk"])
                return
            if "refused" in ack:
                self.log.warning("cache.refused", stage=self.links[index].node_id, entry=ack["refused"],
                                 reason=ack.get("reason"))
                self._drop_entries([int(ack["refused"])])
                return
            victims = self.cache.stored(index, int(ack["stored"]), int(ack["bytes"]), bool(ack["trimmable"]),
                                        int(ack["tokens"]), int(ack.get("floor", 0)))
        except (FrameError, AttributeError, TypeError, ValueError, KeyError) as exc:
            self.log.warning("cache.bad_ack", stage=self.links[index].node_id, reason=exc)
            return
        if victims:
            self._send(0, [json_frame(Kind.CACHE, {"drop": victims})])
        self.metrics.observe_cache(self.cache.stats())

    def _disk_part(self, tokens: list[int], kind: str, scope: str = "") -> dict:
        """What a save or snapshot adds with the disk tier on: the entry's tokens, kind and scope
        (the file keeps the scope, so an entry adopted after a restart stays in its scope)."""
        return {"ids": list(tokens), "kind": kind, "scope": scope} if self._disk else {}

    def _adopt_files(self, index: int, files: object) -> None:
        """A stage listed its disk files; once all did, index those every stage holds and have the
        stages read them back (their acknowledgements index them as usual)."""
        adoptable = self._adoption.offer(index, files)
        if not adoptable:
            return
        pairs = [[f.key, self.cache.add(list(f.tokens), f.kind, f.scope)] for f in adoptable]
        self.log.info("cache.disk_adopted", entries=len(pairs))
        self._send(0, [json_frame(Kind.CACHE, {"adopt": pairs})])

    def _drop_entries(self, ids: list[int]) -> None:
        for i in ids:
            self.cache.remove(i)
        if ids and self.links[0].conn is not None:
            self._send(0, [json_frame(Kind.CACHE, {"drop": ids})])

    def _forget_cache(self, reason: str) -> None:
        """A stage was lost or (re)connected: no request may start from KV that one stage has and
        another has not, so the whole index goes (the stages drop theirs on the RESET that follows)."""
        dropped = self.cache.clear()
        self._adoption = DiskAdoption(len(self.links), self.cache.budget)  # lists of a past session
        if dropped:
            self.log.info("cache.dropped", entries=len(dropped), reason=reason)
        self.metrics.observe_cache(self.cache.stats())


__all__ = ["PromptCaching"]
