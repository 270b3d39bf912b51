"""The coordinator's index of the prompt prefixes whose KV the stages still hold (docs/prompt-cache.md).

Pure bookkeeping, no MLX: a trie over token ids maps each cached sequence to an entry id
that every stage stores under for its own layers. For a new prompt `plan` finds the entry
that saves the most prefill: a trimmable entry (every layer's cache can be cut back, as
`mlx_lm.models.cache.can_trim_prompt_cache` says) serves any common prefix; any other entry
(linear-attention / SSM state, a sliding window past its size) only a prompt it is a whole
prefix of. Reuse never covers the last prompt token: its logits must be computed.

An entry is usable as soon as the frame that makes the stages store it is sent: every stage
handles frames in the order the chain carries them, so a later OPEN that starts from it finds
it there. Its acknowledgements bring its bytes on each stage and whether it trims; until they
are in, it serves only prompts it is a whole prefix of, unless entries of this cluster were
seen to trim. A stage that cannot serve an entry anyway refuses the request,
and the coordinator starts it again without that entry.

Entries belong to a scope (`orchestrator/cache_scope.py`): each scope has its own trie, so a
prompt is only ever planned from entries of requests of its own scope, and `cached_tokens`
counts own-scope reuse only. The byte budget and the eviction order are shared.

The coordinator alone evicts: when a stage's entries exceed its byte budget, victims are chosen
like mlx-lm's `LRUPromptCache` (least recently used, one-off completions before conversation
heads before system prompts) and the stages are told to drop them, so no stage ever drops an
entry on its own and the index never names KV that one stage has and another has not.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("assistant", "user", "system")  # eviction order of preference, as mlx-lm's CacheOrder


@dataclass
class CacheEntry:
    """One cached token sequence, stored on every stage under `id`."""

    id: int
    tokens: tuple[int, ...]
    kind: str
    stored: dict[int, int] = field(default_factory=dict)  # stage index -> bytes it holds for this entry
    trims: dict[int, bool] = field(default_factory=dict)  # stage index -> whether its cache for it can trim
    floor: int = 0  # it cannot be cut back below this many tokens (the largest floor a stage reported)
    scope: str = ""  # only requests of this scope may start from it ("": the default scope)

    def trimmable(self, stages: int) -> bool | None:
        """Whether every stage can trim it: None until they all said so (False as soon as one did not)."""
        if not all(self.trims.values()):
            return False
        return True if len(self.trims) == stages else None


@dataclass(frozen=True)
class Reuse:
    """Start a request from `entry`, cut back to its first `keep` tokens."""

    entry: int
    keep: int


class _Node:
    __slots__ = ("children", "ends", "through")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.through: set[int] = set()  # entries whose tokens pass through (or end at) this node
        self.ends: set[int] = set()  # entries whose tokens end exactly here


class PrefixIndex:
    """Entries, their trie, LRU order and per-stage bytes for one cluster (one coordinator)."""

    def __init__(self, stages: int, budget_bytes: int, first_id: int = 1) -> None:
        self.stages = stages
        self.budget = budget_bytes
        self._next_id = first_id
        self._roots: dict[str, _Node] = {}  # scope -> its trie (a scope's goes with its last entry)
        self._entries: dict[int, CacheEntry] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {k: OrderedDict() for k in KINDS}
        self._bytes = [0] * stages
        self._shortest_untrimmable: int | None = None  # length of the shortest entry a stage could not trim
        self._longest_trimmable = 0  # length of the longest entry every stage could trim
        self.lookups = self.hits = self.tokens_saved = 0

    @property
    def enabled(self) -> bool:
        """A zero budget turns the cache off."""
        return self.budget > 0

    # --- requests ----------------------------------------------------------------------
    def plan(self, prompt: list[int], scope: str = "") -> Reuse | None:
        """The entry of `scope` that saves the most prefill for `prompt` (at most len(prompt) - 1
        tokens), or None. Entries of other scopes are never considered."""
        if not self.enabled or len(prompt) < 2:
            return None
        self.lookups += 1
        node = self._roots.get(scope)
        if node is None:
            return None
        path = []
        for tok in prompt[:len(prompt) - 1]:
            node = node.children.get(tok)
            if node is None:
                break
            path.append(node)
        best: Reuse | None = None
        for depth in range(len(path), 0, -1):  # deepest first: the first usable entry found wins
            n = path[depth - 1]
            exact = next(iter(n.ends), None)
            if exact is not None:
                best = Reuse(exact, depth)
                break
            cut = next((e for e in n.through if self._trims(self._entries[e]) and self._entries[e].floor <= depth),
                       None)
            if cut is not None:
                best = Reuse(cut, depth)
                break
        return best

    def used(self, reuse: Reuse) -> None:
        """A request starts from `reuse`: count it and mark the entry recently used."""
        entry = self._entries[reuse.entry]
        self._lru[entry.kind].move_to_end(entry.id)
        self.hits += 1
        self.tokens_saved += reuse.keep

    def needs_checkpoint(self, length: int) -> bool:
        """Whether a state at `length` tokens must be stored separately to be reused: entries that
        long were seen not to trim (a recurrent state, a window past its size)."""
        return self.enabled and self._shortest_untrimmable is not None and self._shortest_untrimmable <= length

    # --- entries -----------------------------------------------------------------------
    def add(self, tokens: list[int], kind: str = "assistant", scope: str = "") -> int:
        """A new entry of `scope` the stages are about to store; usable once they all acknowledge it."""
        if kind not in KINDS:
            raise ValueError(f"cache entry kind {kind!r}: expected one of {', '.join(KINDS)}")
        entry = CacheEntry(self._next_id, tuple(tokens), kind, scope=scope)
        self._next_id += 1
        self._entries[entry.id] = entry
        self._lru[kind][entry.id] = None
        node = self._roots.setdefault(scope, _Node())
        node.through.add(entry.id)
        for tok in entry.tokens:
            node = node.children.setdefault(tok, _Node())
            node.through.add(entry.id)
        node.ends.add(entry.id)
        return entry.id

    def stored(self, stage: int, entry_id: int, nbytes: int, trimmable: bool, tokens: int, floor: int = 0) -> list[int]:
        """Stage `stage` stored `entry_id` (`floor`: the fewest tokens it can be cut back to there);
        returns the entries every stage must now drop (evictions)."""
        entry = self._entries.get(entry_id)
        if entry is None:
            return [entry_id]  # dropped meanwhile (or never known): the stage must not keep it
        if tokens != len(entry.tokens) or not 0 <= stage < self.stages:
            self.remove(entry_id)
            return [entry_id]
        entry.stored[stage] = nbytes
        entry.trims[stage] = trimmable
        entry.floor = max(entry.floor, floor)
        self._bytes[stage] += nbytes
        victims: list[int] = []
        trims = entry.trimmable(self.stages)
        if trims is False and (self._shortest_untrimmable is None or len(entry.tokens) < self._shortest_untrimmable):
            self._shortest_untrimmable = len(entry.tokens)
        if trims and self._ready(entry_id):
            self._longest_trimmable = max(self._longest_trimmable, len(entry.tokens))
            victims += self._redundant_prefixes(entry)  # shorter trimmable entries on its path only take space
        victims += self._evict()
        for v in victims:
            self.remove(v)
        return victims

    def remove(self, entry_id: int) -> None:
        """Forget an entry (the caller tells the stages to drop it)."""
        entry = self._entries.pop(entry_id, None)
        if entry is None:
            return
        self._lru[entry.kind].pop(entry_id, None)
        for stage, nbytes in entry.stored.items():
            self._bytes[stage] -= nbytes
        root = self._roots[entry.scope]
        node, trail = root, []
        node.through.discard(entry_id)
        for tok in entry.tokens:
            trail.append((node, tok))
            node = node.children[tok]
            node.through.discard(entry_id)
        node.ends.discard(entry_id)
        for parent, tok in reversed(trail):  # prune branches no entry passes through any more
            if parent.children[tok].through:
                break
            del parent.children[tok]
        if not root.through:
            del self._roots[entry.scope]  # as many tries as scopes with entries, no more

    def clear(self) -> list[int]:
        """Forget everything (a stage was replaced or reconnected); returns the ids that were known."""
        ids = list(self._entries)
        self._entries.clear()
        self._roots.clear()
        for lru in self._lru.values():
            lru.clear()
        self._bytes = [0] * self.stages
        return ids

    def stats(self) -> dict:
        """Entries, bytes per stage, hit rate and tokens saved (for /metrics and /health)."""
        ready = sum(1 for e in self._entries if self._ready(e))
        return {"entries": ready, "pending": len(self._entries) - ready, "bytes": list(self._bytes),
                "budget_bytes": self.budget, "lookups": self.lookups, "hits": self.hits,
                "hit_rate": round(self.hits / self.lookups, 4) if self.lookups else 0.0,
                "tokens_saved": self.tokens_saved}

    # --- internals ---------------------------------------------------------------------
    def _ready(self, entry_id: int) -> bool:
        entry = self._entries.get(entry_id)
        return entry is not None and len(entry.stored) == self.stages

    def _trims(self, entry: CacheEntry) -> bool:
        """Whether `entry` can be cut back: as its stages said, or (not all said yet) as this cluster's
        entries did: some trimmed, and none as short failed to (a wrong guess is refused by a stage,
        and the request starts again without the entry)."""
        known = entry.trimmable(self.stages)
        if known is not None:
            return known
        n = len(entry.tokens)
        return self._longest_trimmable > 0 and (self._shortest_untrimmable is None or n < self._shortest_untrimmable)

    def _redundant_prefixes(self, entry: CacheEntry) -> list[int]:
        found, node = [], self._roots[entry.scope]  # only its own scope's: others cannot use it
        for depth, tok in enumerate(entry.tokens[:-1], start=1):
            node = node.children[tok]
            if depth >= entry.floor:  # `entry` cut back to this depth serves whatever they served
                found += [e for e in node.ends if e != entry.id and self._ready(e)
                          and self._entries[e].trimmable(self.stages)]
        return found

    def _evict(self) -> list[int]:
        """Victims until every stage is within budget: mlx-lm's CacheOrder.pop preference."""
        victims: list[int] = []
        order = {k: list(v) for k, v in self._lru.items()}
        spent = list(self._bytes)
        while any(b > self.budget for b in spent):
            victim = _pop_preferred(order)
            if victim is None:
                break
            victims.append(victim)
            for stage, nbytes in self._entries[victim].stored.items():
                spent[stage] -= nbytes
        return victims


def prefill_chunks(length: int, start: int, step: int, checkpoints: set[int] | frozenset[int] = frozenset()
                   ) -> list[tuple[int, int, bool]]:
    """(start, end, checkpoint) of the chunks that prefill prompt[start:length - 1], `step` long as
    mlx-lm's generate_step cuts them, and cut also at each checkpoint (a state stored there)."""
    last = length - 1
    marks = {m for m in checkpoints if start < m < last}
    cuts = sorted({*range(start + step, last, step), *marks, last})
    out, at = [], start
    for end in cuts:
        if end > at:
            out.append((at, end, end in marks))
            at = end
    return out


def system_prompt_end(render: Callable[[list[dict]], list[int]], messages: list[dict],
                      prompt: list[int]) -> tuple[int, ...]:
    """Where the system messages end in a chat `prompt` (as mlx-lm's server finds its "system"
    segment: render them before an empty user turn, take the common prefix), or () when there are none."""
    head = []
    for m in messages:
        if m.get("role") != "system":
            break
        head.append(m)
    if not head:
        return ()
    rendered = render(head + [{"role": "user", "content": ""}])
    end = next((i for i, (a, b) in enumerate(zip(rendered, prompt)) if a != b), min(len(rendered), len(prompt)))
    return (end,) if 0 < end < len(prompt) else ()


def _pop_preferred(order: dict[str, list[int]]) -> int | None:
    """The next victim: from the first kind whose LRU is at least as long as the next kind's
    (mlx_lm.models.cache.LRUPromptCache.CacheOrder.pop), oldest first."""
    for a, b in itertools.pairwise(KINDS):
        if order[a] and len(order[a]) >= len(order[b]):
            return order[a].pop(0)
    for kind in reversed(KINDS):
        if order[kind]:
            return order[kind].pop(0)
    return None


__all__ = ["CacheEntry", "PrefixIndex", "Reuse", "prefill_chunks", "system_prompt_end"]
