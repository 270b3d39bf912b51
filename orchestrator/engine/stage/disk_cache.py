"""The prompt cache's disk tier: a stage's entries as files, so a restarted stage comes back warm.

Files live under the node's models directory, one folder per model and layer range:
`<models>/.prompt-cache/<model hash>/<first>-<last>/<token hash>.safetensors`, written with
mlx-lm's own `save_prompt_cache` (the file format of `mlx_lm.cache_prompt`) and read with its
`load_prompt_cache`. Only the stage's own layers' caches are written: a skipped layer's cache
holds no arrays, only a position, and is rebuilt from a fresh `make_cache()` advanced to it.
The metadata names the format, the model hash, the layer range and the token ids; a file whose
metadata, name, cache classes or positions do not match what this stage would have made is
ignored with a log line and never served, as is a file that does not parse.

Bounded by bytes, least recently used out first (a file's mtime is its last use). Writes go to
a temporary name and are renamed into place, so a file is whole or absent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import KVCache, load_prompt_cache, save_prompt_cache

from orchestrator.engine.model_digest import weights_digest
from orchestrator.engine.stage.stand_ins import advance_skipped
from orchestrator.logs import EventLogger

FORMAT = "pipeserve-prompt-cache-1"
FOLDER = ".prompt-cache"
DIGESTS = "weights-sha256.json"  # under FOLDER: each weight file's sha256, kept while its stat is unchanged


def model_hash(model_dir: Path, digests: Path | None = None) -> str:
    """The folder naming a model's entries: a digest over every byte of its config and weight
    files (`engine/model_digest.py`; `digests` keeps each file's sha256 between starts). Its
    first and last MiB were once enough for a key, until two models differing only mid-file
    shared entries: one's KV adopted by the other, a wrong answer."""
    return weights_digest(model_dir, digests)


def token_key(tokens: list[int] | tuple[int, ...], scope: str = "") -> str:
    """The file name stem of an entry covering `tokens` in prompt-cache `scope` (the default
    scope's names are those of files written before scopes existed)."""
    salt = f"scope\0{scope}\0".encode() if scope else b""
    return hashlib.sha256(salt + struct.pack(f"<{len(tokens)}i", *tokens)).hexdigest()[:40]


@dataclass(frozen=True)
class DiskEntry:
    """A valid entry file: what it covers and how big it is."""

    key: str
    tokens: tuple[int, ...]
    kind: str
    path: Path
    nbytes: int
    scope: str = ""  # the prompt-cache scope it was written for (adopted back into it only)


def _readable(c: Any) -> bool:
    """Whether `load_prompt_cache` can rebuild this cache: it knows only mlx-lm's own cache classes
    (DeepSeek-V4.1 keeps its own LayerCache in its model module)."""
    return hasattr(mlx_cache, type(c).__name__) and all(_readable(m) for m in getattr(c, "caches", ()))


def _skipped(c: Any) -> bool:
    """A skipped layer's cache: positions only, no arrays, or zero-size ones (stand_ins.keep_readable)."""
    return type(c) is KVCache and (c.keys is None or c.keys.size == 0)


def _header(path: Path) -> tuple[dict[str, str], list[str]]:
    """A safetensors file's metadata as `save_prompt_cache` wrote it (our metadata, the cache class
    names), read from its header alone: listing files reads no arrays."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("too short for a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > 64 * 1024 * 1024:
            raise ValueError("a safetensors header this large is not ours")
        raw = fh.read(size)
    try:
        flat = json.loads(raw).get("__metadata__") or {}
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        raise ValueError(f"not a safetensors header: {exc}") from None
    meta = {k[2:]: v for k, v in flat.items() if k.startswith("0.")}
    classes = [flat[f"1.{i}"] for i in range(len(flat)) if f"1.{i}" in flat]
    return meta, classes


class DiskTier:
    """One stage's entry files for one model and layer range."""

    def __init__(self, models_dir: Path, model_dir: Path, layers: tuple[int, int], budget_bytes: int,
                 make_cache: Callable[[], list[Any]], log: EventLogger) -> None:
        self.model = model_hash(model_dir, Path(models_dir) / FOLDER / DIGESTS)
        self.layers = layers
        self.budget = budget_bytes
        self.make_cache = make_cache
        self.log = log
        self.refused = False  # the model's caches cannot go to disk (logged once)
        self.root = Path(models_dir) / FOLDER / self.model / f"{layers[0]}-{layers[1]}"
        self.root.mkdir(parents=True, exist_ok=True)

    def write(self, tokens: list[int] | tuple[int, ...], cache: list[Any], kind: str, scope: str = "") -> Path | None:
        """Write an entry of `scope` covering `tokens`, then evict past the budget. A write that fails (a full
        disk, a cache mlx-lm cannot serialize) is logged and leaves no file: the entry stays in
        memory, the disk tier just does not hold it. Returns the file, or None."""
        unreadable = sorted({type(c).__name__ for c in cache if not _readable(c)})
        if unreadable:
            if not self.refused:  # said once: every entry of this model would be refused alike
                self.log.warning("cache.disk_unsupported", classes=",".join(unreadable),
                                 reason="mlx-lm's load_prompt_cache cannot read these caches back; "
                                        "the entries stay in memory only")
                self.refused = True
            return None
        saved = [i for i, c in enumerate(cache) if not _skipped(c)]
        meta = {"format": FORMAT, "model": self.model, "layers": json.dumps(list(self.layers)), "kind": kind,
                "tokens": json.dumps(list(tokens)), "saved": json.dumps(saved), "length": str(len(cache)),
                "scope": scope}
        path = self.root / f"{token_key(tokens, scope)}.safetensors"
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.safetensors")
        try:
            save_prompt_cache(str(tmp), [cache[i] for i in saved], meta)
            os.replace(tmp, path)
            self.evict()
        except (OSError, ValueError, RuntimeError) as exc:
            with contextlib.suppress(OSError):  # the folder itself may be what failed
                tmp.unlink(missing_ok=True)
            self.log.warning("cache.disk_write_failed", path=str(path), reason=exc)
            return None
        return path

    def scan(self) -> list[DiskEntry]:
        """The valid entry files, most recently used first (invalid ones are logged and skipped)."""
        found = []
        for path in sorted(self.root.glob("*.safetensors"), key=lambda p: p.stat().st_mtime, reverse=True):
            if path.name.startswith("."):
                continue
            try:
                entry, _ = self._read(path, load=False)
            except (ValueError, OSError, RuntimeError, KeyError, TypeError) as exc:
                self.log.warning("cache.disk_ignored", path=str(path), reason=exc)
                continue
            found.append(entry)
        return found

    def load(self, entry: DiskEntry) -> list[Any]:
        """The whole cache list of an entry (raises ValueError when the file no longer matches)."""
        return self.read(entry.key)[1]

    def read(self, key: str) -> tuple[DiskEntry, list[Any]]:
        """The entry file named `key` and its whole cache list; raises ValueError (OSError when
        absent) when it cannot be served."""
        if not re.fullmatch(r"[0-9a-f]{40}", key):
            raise ValueError(f"{key!r} is not an entry key")
        path = self.root / f"{key}.safetensors"
        entry, cache = self._read(path, load=True)
        os.utime(path)  # used: last to go
        return entry, cache

    def evict(self) -> list[Path]:
        """Remove the least recently used files until the folder is within budget."""
        files = sorted((p for p in self.root.glob("*.safetensors") if not p.name.startswith(".")),
                       key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in files)
        gone = []
        while files and total > self.budget:
            p = files.pop(0)
            total -= p.stat().st_size
            p.unlink(missing_ok=True)
            gone.append(p)
        return gone

    def _read(self, path: Path, load: bool) -> tuple[DiskEntry, list[Any]]:
        """Check one file: its header (no arrays read) and, when `load`, its caches too, returned
        as a whole cache list. Raises on any mismatch."""
        meta, classes = _header(path)
        if meta.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        if meta.get("model") != self.model:
            raise ValueError(f"written for model {meta.get('model')}, this stage serves {self.model}")
        if json.loads(meta["layers"]) != list(self.layers):
            raise ValueError(f"written for layers {meta['layers']}, this stage has {list(self.layers)}")
        tokens = tuple(int(t) for t in json.loads(meta["tokens"]))
        scope = str(meta.get("scope", ""))
        if not tokens or token_key(tokens, scope) != path.stem:
            raise ValueError("its tokens and scope do not match its name")
        fresh = self.make_cache()
        saved = [int(i) for i in json.loads(meta["saved"])]
        if int(meta["length"]) != len(fresh) or len(saved) != len(classes):
            raise ValueError("its cache list does not match this stage's")
        for i, name in zip(saved, classes, strict=True):
            if not 0 <= i < len(fresh) or name != type(fresh[i]).__name__:
                raise ValueError(f"layer {i}'s cache is a {name}, this stage makes a "
                                 f"{type(fresh[i]).__name__ if 0 <= i < len(fresh) else 'none'}")
        entry = DiskEntry(path.stem, tokens, meta.get("kind", "assistant"), path, path.stat().st_size, scope)
        if not load:
            return entry, []
        loaded = load_prompt_cache(str(path))
        if len(loaded) != len(saved):
            raise ValueError("its caches do not match its header")
        for i, c in zip(saved, loaded, strict=True):
            offset = getattr(c, "offset", None)
            if type(c) is not type(fresh[i]) or (offset is not None and offset != len(tokens)):
                raise ValueError(f"layer {i}'s cache does not hold {len(tokens)} positions of a "
                                 f"{type(fresh[i]).__name__}")
            fresh[i] = c
        for i, c in enumerate(fresh):
            if i not in saved:
                advance_skipped(c, len(tokens))
        return entry, fresh


__all__ = ["FOLDER", "FORMAT", "DiskEntry", "DiskTier", "model_hash", "token_key"]
