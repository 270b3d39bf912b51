"""A stage's prompt-cache entries: KV (or recurrent state) of its own layers for prefixes the
coordinator indexes (prefix_index.py, docs/prompt-cache.md).

An entry is a whole request cache list (the family's own `make_cache()` objects; skipped
layers only count positions), stored under the id the coordinator assigned: when a request
closes (its prompt and generated tokens), or as a checkpoint in the middle of a prefill. A
request that starts from an entry gets a deep copy (as mlx-lm's `LRUPromptCache` hands out),
trimmed with the caches' own `trim`: entries are never written to, so any number of requests,
running at once, may start from one. The stage never evicts on its own; the coordinator says
which entries to drop.

With the disk tier on (`disk_cache.py`), every stored entry is also written to a file, and the
coordinator, once the pipeline is ready, asks for the files (`{"disk": "list"}`) and names the
ones every stage holds as entries (`{"adopt": [[key, id], ...]}`): a restarted stage comes back
warm.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm.models.cache import can_trim_prompt_cache

from orchestrator.engine.stage.disk_cache import DiskTier
from orchestrator.engine.stage.faults import Faults
from orchestrator.engine.wire import Frame, FrameError


class CacheMiss(ValueError):
    """A request asked to start from an entry this stage cannot serve as asked."""


@dataclass
class StoredEntry:
    """One entry on this stage."""

    cache: list[Any]
    tokens: int
    nbytes: int


def cache_bytes(cache: list[Any]) -> int:
    """Bytes the caches hold (mlx-lm's `nbytes`; skipped layers hold none)."""
    return sum(c.nbytes for c in cache)


def trim_floor(cache: list[Any], tokens: int) -> int:
    """The fewest tokens a `tokens`-long cache can be cut back to with its own `trim` (`tokens` when it
    cannot trim at all: a recurrent state, a full window). Measured on shallow copies: `trim` moves
    offsets only, never arrays (a chunked-attention cache trims no further than its chunk's start)."""
    if not can_trim_prompt_cache(cache):
        return tokens

    def most(c: Any) -> int:
        inner = getattr(c, "caches", None)  # a CacheList trims each of its caches
        if inner is not None:
            return min((most(x) for x in inner), default=tokens)
        if _unused(c):
            return tokens
        return copy.copy(c).trim(tokens)

    return tokens - min((most(c) for c in cache), default=tokens)


def trim_exactly(cache: list[Any], n: int) -> None:
    """Cut every layer's cache back by `n` tokens with its own `trim`; raises CacheMiss if any cannot."""
    if n == 0:
        return
    if not can_trim_prompt_cache(cache):
        raise CacheMiss(f"the cache cannot be trimmed by {n} tokens (a recurrent state or a full sliding window)")
    for c in cache:
        if not _unused(c) and c.trim(n) != n:
            raise CacheMiss(f"a layer's cache trimmed less than {n} tokens")


def _unused(c: Any) -> bool:
    """A cache no position ever reached (a layer without attention keeps one): nothing to cut back.
    Skipped layers' caches do count positions, so they are trimmed like the stage's own."""
    return getattr(c, "offset", None) == 0 and getattr(c, "caches", None) is None


class StageCache:
    """The entries one stage holds for its coordinator (owned by the MLX thread)."""

    def __init__(self, faults: Faults | None = None, disk: DiskTier | None = None) -> None:
        self.entries: dict[int, StoredEntry] = {}
        self.faults = faults or Faults()
        self.disk = disk
        self.hits = 0
        self.tokens_reused = 0

    @property
    def nbytes(self) -> int:
        """Bytes of all entries."""
        return sum(e.nbytes for e in self.entries.values())

    def start(self, spec: Any) -> tuple[list[Any], int]:
        """A new request's cache from an OPEN frame's `cache` part ({"from": id, "keep": n}): a copy of
        the entry cut back to `keep` tokens, and that position. Raises CacheMiss."""
        try:
            entry_id, keep = int(spec["from"]), int(spec["keep"])
        except (TypeError, KeyError, ValueError):
            raise CacheMiss(f"bad prompt-cache reference {spec!r}") from None
        entry = self.entries.get(entry_id)
        if "cache-stale" in self.faults.kinds and self.entries:
            entry = self.entries[min(self.entries)]  # test fault: KV of another prefix than the one named
        if entry is None:
            raise CacheMiss(f"prompt-cache entry {entry_id} is not on this stage")
        if not 0 < keep <= entry.tokens:
            raise CacheMiss(f"cannot keep {keep} of prompt-cache entry {entry_id}'s {entry.tokens} tokens")
        cache = copy.deepcopy(entry.cache)
        if "cache-skip-trim" not in self.faults.kinds:  # test fault: the copy keeps its later tokens
            trim_exactly(cache, entry.tokens - keep)
        self.hits += 1
        self.tokens_reused += keep
        return cache, keep

    def store(self, entry_id: int, cache: list[Any], tokens: int, snapshot: bool,
              ids: list[int] | None = None, kind: str = "assistant", scope: str = "") -> dict:
        """Keep `cache` (covering `tokens` positions) as entry `entry_id`; a snapshot of a running
        request is copied, a closed request's cache is taken as it is. With the disk tier on and
        the entry's token `ids` given, it is written to disk too (with its prompt-cache `scope`).
        Returns the acknowledgement."""
        kept = copy.deepcopy(cache) if snapshot else cache
        if self.disk is not None and ids is not None and len(ids) == tokens:
            self.disk.write(ids, kept, kind, scope)
        entry = StoredEntry(kept, tokens, cache_bytes(kept))
        if "cache-forget" not in self.faults.kinds:  # test fault: acknowledged but not kept
            self.entries[entry_id] = entry
        floor = trim_floor(kept, tokens)
        return {"stored": entry_id, "bytes": entry.nbytes, "tokens": tokens, "trimmable": floor < tokens,
                "floor": floor}

    def command(self, command: dict, closed: Any, running: dict[int, Any]) -> list[dict]:
        """Carry out a CLOSE's {"save": id} (keep the `closed` request's cache), a CACHE frame's
        {"snapshot": request, "as": id, "tokens": n} (a checkpoint of one of the `running`
        requests) or {"drop": [ids]}; returns the acknowledgements for the coordinator. Raises
        TypeError / ValueError / KeyError on a malformed command."""
        acks = []
        ids = [int(t) for t in command["ids"]] if "ids" in command else None
        kind = str(command.get("kind", "assistant"))
        scope = str(command.get("scope", ""))  # the coordinator's scope of the entry (disk tier only)
        if "drop" in command:
            self.drop([int(i) for i in command["drop"]])
        if "save" in command and closed is not None:
            acks.append(self.store(int(command["save"]), closed.cache, closed.position, snapshot=False,
                                   ids=ids, kind=kind, scope=scope))
        if "snapshot" in command:
            state = running.get(int(command["snapshot"]))
            entry_id, tokens = int(command["as"]), int(command["tokens"])
            if state is None or state.position != tokens:
                acks.append({"refused": entry_id, "reason": "no such request at that position"})
            else:
                acks.append(self.store(entry_id, state.cache, tokens, snapshot=True, ids=ids, kind=kind,
                                       scope=scope))
        if command.get("disk") == "list":
            files = self.disk.scan() if self.disk is not None else []
            acks.append({"disk": [[e.key, list(e.tokens), e.kind, e.nbytes, e.scope] for e in files]})
        if "adopt" in command:
            acks += [self._adopt(str(key), int(entry_id)) for key, entry_id in command["adopt"]]
        return acks

    def _adopt(self, key: str, entry_id: int) -> dict:
        """Entry `entry_id` is the disk file `key` (read back now); a refusal when it cannot be."""
        try:
            if self.disk is None:
                raise ValueError("this stage has no disk tier")
            found, cache = self.disk.read(key)
        except (ValueError, OSError, RuntimeError, KeyError, TypeError) as exc:
            return {"refused": entry_id, "reason": f"disk entry {key}: {exc}"}
        return self.store(entry_id, cache, len(found.tokens), snapshot=False)

    def drop(self, ids: list[int]) -> None:
        """Forget the named entries (the coordinator evicted them)."""
        for i in ids:
            self.entries.pop(i, None)

    def clear(self) -> None:
        """Forget every entry (a new coordinator session or a RESET: its index is gone too)."""
        self.entries.clear()

    def stats(self) -> dict:
        """What the stage card and /metrics show about this stage's entries."""
        return {"entries": len(self.entries), "bytes": self.nbytes, "hits": self.hits,
                "tokens_reused": self.tokens_reused}


def disk_tier(config: Any, model: Any, log: Any) -> DiskTier | None:
    """The stage's disk tier when the cluster turns it on (`prompt_cache_disk_bytes`), under the
    node's models directory (the folder holding the model's directory), else None."""
    budget = config.cluster.prompt_cache_disk_bytes
    if budget <= 0 or config.cluster.prompt_cache_budget <= 0:
        return None
    try:
        tier = DiskTier(Path(model.model_dir).resolve().parent, model.model_dir, model.layer_range, budget,
                        model.make_cache, log)
    except OSError as exc:  # a read-only models directory: serve, without the disk tier
        log.warning("cache.disk_tier_unavailable", reason=exc)
        return None
    log.info("cache.disk_tier", path=str(tier.root), budget_bytes=budget, files=len(tier.scan()))
    return tier


def json_or_empty(frame: Frame) -> dict:
    """A control frame's JSON object ({} when it carries none, or anything but an object)."""
    if not frame.payload:
        return {}
    try:
        obj = frame.json()
    except FrameError:
        return {}
    return obj if isinstance(obj, dict) else {}


__all__ = ["CacheMiss", "StageCache", "StoredEntry", "cache_bytes", "disk_tier", "json_or_empty", "trim_exactly",
           "trim_floor"]
