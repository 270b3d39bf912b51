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
    """A file every stage holds: its key, tokens, kind and prompt-cache scope."""

    key: str
    tokens: tuple[int, ...]
    kind: str
    scope: str = ""


class DiskAdoption:
    """Collects each stage's list; the adoptable files once all stages answered."""

    def __init__(self, stages: int, budget_bytes: int) -> None:
        self.stages = stages
        self.budget = budget_bytes
        self._lists: dict[int, list[tuple[str, tuple[int, ...], str, int, str]]] = {}

    def offer(self, stage: int, files: Any) -> list[Adoptable] | None:
        """Stage `stage` listed `files` ([[key, tokens, kind, bytes, scope?], ...]); returns the
        adoptable files once every stage listed its own (else None). Raises ValueError on a
        malformed list."""
        if not 0 <= stage < self.stages or not isinstance(files, list):
            raise ValueError("a disk list from an unknown stage, or not a list")
        if any(not isinstance(f, list) or len(f) not in (4, 5) for f in files):
            raise ValueError("a disk list entry is not [key, tokens, kind, bytes, scope?]")
        self._lists[stage] = [(str(f[0]), tuple(int(t) for t in f[1]), str(f[2]), int(f[3]),
                               str(f[4]) if len(f) > 4 else "") for f in files]
        if len(self._lists) < self.stages:
            return None
        held = [{k: (toks, n, sc) for k, toks, _, n, sc in self._lists[i]} for i in range(self.stages)]
        spent = [0] * self.stages
        out = []
        for key, tokens, kind, _, scope in self._lists[0]:
            found = [h.get(key) for h in held]
            if any(f is None or f[0] != tokens or f[2] != scope for f in found):
                continue
            sizes = [f[1] for f in found]  # type: ignore[index]
            if any(s + b > self.budget for s, b in zip(spent, sizes, strict=True)):
                continue
            spent = [s + b for s, b in zip(spent, sizes, strict=True)]
            out.append(Adoptable(key, tokens, kind if kind in ("assistant", "user", "system") else "assistant", scope))
        self._lists.clear()
        return out


__all__ = ["Adoptable", "DiskAdoption"]
