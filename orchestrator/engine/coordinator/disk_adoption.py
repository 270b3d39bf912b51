"""Which prompt-cache files the index may offer after a (re)start: those every stage holds.

With the disk tier on (engine/stage/disk_cache.py), each stage lists its valid entry files
when the pipeline becomes ready. An entry is usable only when every stage can start a request
from it, so the coordinator indexes the files all stages hold for the same tokens, most
recently used first (stage 0's order), as many as fit the memory budget on every stage; the
stages then read them back under the ids the index assigned. Pure bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Adoptable:
    """A file every stage holds: its key, tokens and kind."""

    key: str
    tokens: tuple[int, ...]
    kind: str


class DiskAdoption:
    """Collects each stage's list; the adoptable files once all stages answered."""

    def __init__(self, stages: int, budget_bytes: int) -> None:
        self.stages = stages
        self.budget = budget_bytes
        self._lists: dict[int, list[tuple[str, tuple[int, ...], str, int]]] = {}

    def offer(self, stage: int, files: Any) -> list[Adoptable] | None:
        """Stage `stage` listed `files` ([[key, tokens, kind, bytes], ...]); returns the adoptable
        files once every stage listed its own (else None). Raises ValueError on a malformed list."""
        if not 0 <= stage < self.stages or not isinstance(files, list):
            raise ValueError("a disk list from an unknown stage, or not a list")
        self._lists[stage] = [(str(k), tuple(int(t) for t in toks), str(kind), int(n)) for k, toks, kind, n in files]
        if len(self._lists) < self.stages:
            return None
        held = [{k: (toks, n) for k, toks, _, n in self._lists[i]} for i in range(self.stages)]
        spent = [0] * self.stages
        out = []
        for key, tokens, kind, _ in self._lists[0]:
            found = [h.get(key) for h in held]
            if any(f is None or f[0] != tokens for f in found):
                continue
            sizes = [f[1] for f in found]  # type: ignore[index]
            if any(s + b > self.budget for s, b in zip(spent, sizes, strict=True)):
                continue
            spent = [s + b for s, b in zip(spent, sizes, strict=True)]
            out.append(Adoptable(key, tokens, kind if kind in ("assistant", "user", "system") else "assistant"))
        self._lists.clear()
        return out


__all__ = ["Adoptable", "DiskAdoption"]
