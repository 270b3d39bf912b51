"""A digest naming a model's weights exactly, for keys that must never match another model's.

The prompt cache's disk tier (`engine/stage/disk_cache.py`) files its entries under this digest:
an entry (KV computed by this model's weights) adopted by another model is a wrong answer. Its
earlier key read each weight file's size, header and first and last MiB, so two models differing
only in the middle of a file (a fine-tune leaving the embeddings and the last tensors alone)
shared entries. Here every byte of `config.json` and of every `*.safetensors` file goes in:
the sha256 of each file, as the agents' manifests hold it.

Hashing a large model takes seconds (about 1.4 GB/s per core), so each file's sha256 is kept in a
small JSON file beside the entries, keyed by the file's path, size, mtime, ctime and inode — what
the agent's own manifest cache trusts: rewriting a file in place changes its mtime and ctime,
replacing it changes its inode. Files are hashed in parallel (hashlib releases the GIL).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.atomic_write import write_atomically

CHUNK = 8 << 20  # bytes per read while hashing
MAX_WORKERS = 4


def weight_files(model_dir: Path) -> list[Path]:
    """The files whose bytes decide what the model computes: its config and every weight file."""
    model_dir = Path(model_dir)
    return [model_dir / "config.json", *sorted(model_dir.glob("*.safetensors"))]


def file_sha256(path: Path) -> str:
    """The sha256 of a whole file, read in CHUNK-sized blocks."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_cache(cache_path: Path | None) -> dict[str, dict]:
    if cache_path is None:
        return {}
    try:
        data = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: hash again
    return data if isinstance(data, dict) else {}


def weights_digest(model_dir: Path, cache_path: Path | None = None) -> str:
    """A digest over every byte of the model's config and weight files (32 hex digits). With
    `cache_path`, each file's sha256 is reused while its size, mtime, ctime and inode are unchanged."""
    files = weight_files(model_dir)
    cache = _read_cache(cache_path)
    keys = {f: _stat_key(f) for f in files}
    known: dict[Path, str] = {}
    for f in files:
        hit = cache.get(str(f.resolve()))
        if isinstance(hit, dict) and hit.get("stat") == keys[f] and isinstance(hit.get("sha256"), str):
            known[f] = hit["sha256"]
    missing = [f for f in files if f not in known]
    if missing:
        with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(missing))) as pool:
            known.update(zip(missing, pool.map(file_sha256, missing), strict=True))
        if cache_path is not None:
            # Entries of files that are gone go too, so the file stays as small as the models present.
            kept = {p: v for p, v in cache.items() if os.path.exists(p)}
            kept.update({str(f.resolve()): {"stat": keys[f], "sha256": known[f]} for f in missing})
            try:
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                write_atomically(cache_path, json.dumps(kept))
            except OSError:
                pass  # a read-only or full disk: the digest is right, the next start hashes again
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{keys[f][0]}\0{known[f]}\n".encode())
    return h.hexdigest()[:32]


__all__ = ["file_sha256", "weight_files", "weights_digest"]
