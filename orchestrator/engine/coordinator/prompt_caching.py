"""The coordinator's prompt cache: which stages hold which KV entries, and the disk tier's files.

Owned by the scheduler thread (`pipeline.Pipeline`). `PromptCache` keeps the prefix index
(`prefix_index.PrefixIndex`) true to what the stages hold: their acknowledgements index entries and
evict over budget, a refused or missing entry is forgotten on every stage, a lost or reconnected
stage empties the whole index, and once ready the files every stage still holds on disk are adopted
back (a restarted stage comes back warm). It talks to the stages only through `send`, which reaches
stage 0 (control frames travel down the chain from there).
"""

from __future__ import annotations

from typing import Callable

from orchestrator.engine.coordinator.disk_adoption import DiskAdoption
from orchestrator.engine.coordinator.metrics import Metrics
from orchestrator.engine.coordinator.prefix_index import PrefixIndex
from orchestrator.engine.wire import Frame, FrameError, Kind, json_frame
from orchestrator.logs import EventLogger


class PromptCache:
    """The prefix index and the disk tier's adoption, kept true to the stages' acknowledgements."""

    def __init__(self, index: PrefixIndex, disk: bool, stage_names: list[str], send: Callable[[list[Frame]], bool],
                 connected: Callable[[], bool], log: EventLogger, metrics: Metrics) -> None:
        self.index = index
        self.disk = disk  # the disk tier is on: saves carry their tokens, the stages write files
        self._names = stage_names
        self._send = send  # to stage 0
        self._connected = connected  # whether stage 0 is connected (a drop is not worth losing it)
        self.log = log
        self.metrics = metrics
        self._adoption = DiskAdoption(len(stage_names), index.budget)

    def on_ack(self, stage: int, f: Frame) -> None:
        """A stage stored (or could not store) a prompt-cache entry: index it, evict over budget."""
        try:
            ack = f.json()
            if "disk" in ack:
                self._adopt_files(stage, ack["disk"])
                return
            if "refused" in ack:
                self.log.warning("cache.refused", stage=self._names[stage], entry=ack["refused"],
                                 reason=ack.get("reason"))
                self.drop([int(ack["refused"])])
                return
            victims = self.index.stored(stage, int(ack["stored"]), int(ack["bytes"]), bool(ack["trimmable"]),
                                        int(ack["tokens"]), int(ack.get("floor", 0)))
        except (FrameError, AttributeError, TypeError, ValueError, KeyError) as exc:
            self.log.warning("cache.bad_ack", stage=self._names[stage], reason=exc)
            return
        if victims:
            self._send([json_frame(Kind.CACHE, {"drop": victims})])
        self.observe()

    def disk_part(self, tokens: list[int], kind: str, scope: str = "") -> dict:
        """What a save or snapshot adds with the disk tier on: the entry's tokens, kind and scope
        (the file keeps the scope, so an entry adopted after a restart stays in its scope)."""
        return {"ids": list(tokens), "kind": kind, "scope": scope} if self.disk else {}

    def list_disk(self) -> None:
        """The pipeline is ready: ask every stage for the files it holds (their answers are adopted)."""
        if self.disk:
            self._adoption = DiskAdoption(len(self._names), self.index.budget)
            self._send([json_frame(Kind.CACHE, {"disk": "list"})])

    def _adopt_files(self, stage: int, files: object) -> None:
        """A stage listed its disk files; once all did, index those every stage holds and have the
        stages read them back (their acknowledgements index them as usual)."""
        adoptable = self._adoption.offer(stage, files)
        if not adoptable:
            return
        pairs = [[f.key, self.index.add(list(f.tokens), f.kind, f.scope)] for f in adoptable]
        self.log.info("cache.disk_adopted", entries=len(pairs))
        self._send([json_frame(Kind.CACHE, {"adopt": pairs})])

    def drop(self, ids: list[int]) -> None:
        """Forget these entries here and on every stage."""
        for i in ids:
            self.index.remove(i)
        if ids and self._connected():
            self._send([json_frame(Kind.CACHE, {"drop": ids})])

    def forget(self, reason: str) -> None:
        """A stage was lost or (re)connected: no request may start from KV that one stage has and
        another has not, so the whole index goes (the stages drop theirs on the RESET that follows)."""
        dropped = self.index.clear()
        self._adoption = DiskAdoption(len(self._names), self.index.budget)  # lists of a past session
        if dropped:
            self.log.info("cache.dropped", entries=len(dropped), reason=reason)
        self.observe()

    def observe(self) -> None:
        """Publish the index's figures on /metrics (lookups, hits, entries, bytes)."""
        self.metrics.observe_cache(self.index.stats())


__all__ = ["PromptCache"]
