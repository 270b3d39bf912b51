"""The node's models: what each directory is, its sha256 manifest, and safe file access.

Every model is one directory directly inside the models directory, named by its model id.
Hashing a multi-GB model takes seconds, so a manifest is cached (in the state directory)
per file under its (size, mtime, ctime, inode): any write to a file — even one that puts
the old mtime back, which still moves ctime — makes that file be hashed again. A file of
several blocks gets its per-block sha256 in the same pass (`blocks.hash_file`, on two
threads), so peers can copy it verifying blocks on every core.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from importlib.util import find_spec
from pathlib import Path

from orchestrator.agent.copy.blocks import hash_file
from orchestrator.agent.names import MAX_DEPTH, InvalidName, check_model_id, check_relpath
from orchestrator.agent.schemas import CheckResult, FileEntry, Manifest, ModelInfo
from orchestrator.atomic_write import write_atomically
from orchestrator.families.decoder_config import HIDDEN_KEYS, ModelConfigError, decoder_view, first_int, layer_count
from orchestrator.families.support import ALIASES, unsupported_reason
from orchestrator.logs import EventLogger
from orchestrator.models.describe import ModelDescriptionError, describe_model

CHUNK = 1 << 20  # hashing block


class ModelNotFound(LookupError):
    """No such model directory (or file) on this node."""


def contained(root: Path, candidate: Path) -> Path:
    """`candidate` resolved (symlinks followed); InvalidName unless it lies inside `root`."""
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise InvalidName(f"{candidate.name!r} resolves outside the models directory")
    return resolved


def sha256_file(path: Path, limit: int | None = None) -> str:
    """Hex sha256 of a file (of its first `limit` bytes when given)."""
    digest = hashlib.sha256()
    remaining = limit
    with open(path, "rb") as f:
        while remaining is None or remaining > 0:
            block = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
            if not block:
                break
            digest.update(block)
            if remaining is not None:
                remaining -= len(block)
    return digest.hexdigest()


def _signature(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _entry(cached: list) -> FileEntry:
    """A manifest entry from a cache entry [size, mtime, ctime, inode, sha256, blocks?]."""
    blocks = cached[5] if len(cached) > 5 and isinstance(cached[5], dict) else None
    try:
        return FileEntry(size=cached[0], sha256=cached[4], blocks=blocks)
    except ValueError:  # a damaged cache entry's blocks: the file is still what its sha256 says
        return FileEntry(size=cached[0], sha256=cached[4])


class Inventory:
    """Models under `models_dir`; the manifest cache is kept in `cache_path`. Thread-safe."""

    def __init__(self, models_dir: Path, cache_path: Path, log: EventLogger) -> None:
        self.root = Path(models_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._cache_path = cache_path
        self._log = log
        self._lock = threading.Lock()
        self._model_locks: dict[str, threading.Lock] = {}
        try:
            self._cache: dict[str, dict[str, list]] = json.loads(cache_path.read_text())
        except (OSError, ValueError):
            self._cache = {}

    # --- paths ---------------------------------------------------------------------

    def model_dir(self, model_id: str, must_exist: bool = True) -> Path:
        """The directory of `model_id` (validated; a symlink leaving the models dir is refused)."""
        path = self.root / check_model_id(model_id)
        if os.path.lexists(path):
            path = contained(self.root, path)
        if must_exist and not path.is_dir():
            raise ModelNotFound(f"no model {model_id!r} on this node")
        return path

    def file_path(self, model_id: str, relpath: str) -> Path:
        """The regular file `relpath` of a model, for serving to a peer; never outside the models directory."""
        base = self.model_dir(model_id)
        check_relpath(relpath)
        path = base / relpath
        if not os.path.lexists(path):
            raise ModelNotFound(f"model {model_id!r} has no file {relpath!r}")
        if relpath not in self.scan(model_id)[0]:  # only what the manifest lists is ever served
            raise InvalidName(f"{relpath!r} is not a file of model {model_id!r} (hidden, linked outside or too deep)")
        resolved = contained(self.root, path)  # a link to another model's file is fine; outside is not
        if not resolved.is_file():
            raise InvalidName(f"{relpath!r} is not a regular file of model {model_id!r}")
        return resolved

    def ids(self) -> list[str]:
        """Model ids present (directories with a valid id; hidden working directories skipped)."""
        out = []
        for entry in sorted(os.listdir(self.root)):
            try:
                self.model_dir(entry)
            except (InvalidName, ModelNotFound):
                continue
            out.append(entry)
        return out

    def scan(self, model_id: str) -> tuple[dict[str, os.stat_result], list[str]]:
        """The model's files {relpath: stat} and what was ignored (with why)."""
        base = self.model_dir(model_id)
        files: dict[str, os.stat_result] = {}
        ignored: list[str] = []
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = Path(dirpath).relative_to(base)
            depth = len(rel_dir.parts)
            for d in list(dirnames):
                if d.startswith(".") or depth + 1 >= MAX_DEPTH or os.path.islink(os.path.join(dirpath, d)):
                    dirnames.remove(d)
                    ignored.append(f"{(rel_dir / d).as_posix()}/ (hidden, linked or too deep)")
            for name in filenames:
                rel = (rel_dir / name).as_posix()
                try:
                    check_relpath(rel)
                    resolved = contained(self.root, Path(dirpath) / name)
                    st = os.stat(resolved)
                    if not stat.S_ISREG(st.st_mode):
                        raise InvalidName("not a regular file")
                except (InvalidName, OSError) as exc:
                    ignored.append(f"{rel} ({exc})")
                    continue
                files[rel] = st
        return dict(sorted(files.items())), ignored

    # --- manifests -----------------------------------------------------------------

    def _model_lock(self, model_id: str) -> threading.Lock:
        with self._lock:
            return self._model_locks.setdefault(model_id, threading.Lock())

    def manifest(self, model_id: str, rehash: bool = False) -> Manifest:
        """Per-file size and sha256, hashing only files changed since they were last hashed."""
        with self._model_lock(model_id):
            files, _ = self.scan(model_id)
            base = self.model_dir(model_id)
            with self._lock:
                cached = dict(self._cache.get(model_id, {}))
            fresh: dict[str, list] = {}
            hashed = 0
            for rel, st in files.items():
                sig = _signature(st)
                entry = cached.get(rel)
                if rehash or entry is None or entry[:4] != sig:
                    digest, blocks = hash_file(base / rel)  # the blocks from the same bytes (see `blocks`)
                    entry = [*sig, digest] + ([blocks] if blocks is not None else [])
                    hashed += 1
                fresh[rel] = entry
            if hashed or fresh.keys() != cached.keys():
                self._store(model_id, fresh)
            if hashed:
                self._log.info("model.hashed", model=model_id, files=hashed)
            return Manifest(files={rel: _entry(e) for rel, e in fresh.items()})

    def record(self, model_id: str, manifest: Manifest) -> None:
        """Seed the cache after a verified download, so the new model is not hashed again.

        The manifest's blocks are kept: a download verified every block, or the whole file and
        then computed them in the same pass (see `blocks`).
        """
        files, _ = self.scan(model_id)
        entries = {}
        for rel, st in files.items():
            e = manifest.files.get(rel)
            if e is not None and st.st_size == e.size:
                entries[rel] = [*_signature(st), e.sha256] + ([e.blocks.model_dump()] if e.blocks else [])
        self._store(model_id, entries)

    def forget(self, model_id: str) -> None:
        """Drop a deleted model's cached manifest."""
        with self._lock:
            if self._cache.pop(model_id, None) is not None:
                write_atomically(self._cache_path, json.dumps(self._cache))

    def _store(self, model_id: str, entries: dict[str, list]) -> None:
        with self._lock:
            self._cache[model_id] = entries
            for gone in [m for m in self._cache if not (self.root / m).is_dir()]:
                del self._cache[gone]
            write_atomically(self._cache_path, json.dumps(self._cache))

    def check(self, model_id: str, expected: Manifest, rehash: bool = False) -> CheckResult:
        """Classify this node's copy: present, needs_download, or mismatch (naming the files)."""
        try:
            have = self.manifest(model_id, rehash=rehash).files
        except ModelNotFound:
            return CheckResult(model_id=model_id, status="needs_download", missing=sorted(expected.files),
                               message="the model is not on this node")
        missing = sorted(p for p in expected.files if p not in have)
        mismatched = sorted(p for p, e in expected.files.items() if p in have and have[p] != e)
        unexpected = sorted(p for p in have if p not in expected.files)
        if mismatched or unexpected:
            parts = ([f"differs: {', '.join(mismatched)}"] if mismatched else []) + \
                    ([f"not in the manifest: {', '.join(unexpected)}"] if unexpected else []) + \
                    ([f"missing: {', '.join(missing)}"] if missing else [])
            return CheckResult(model_id=model_id, status="mismatch", missing=missing, mismatched=mismatched,
                               unexpected=unexpected, message="; ".join(parts))
        if missing:
            return CheckResult(model_id=model_id, status="needs_download", missing=missing,
                               message=f"missing: {', '.join(missing)}")
        return CheckResult(model_id=model_id, status="present", message="every file matches the manifest")

    # --- description ---------------------------------------------------------------

    def describe(self, model_id: str, with_manifest: bool = False) -> ModelInfo:
        """What the model is (MLX or not, and why), its shape and size; optionally its manifest."""
        files, ignored = self.scan(model_id)
        info = ModelInfo(id=model_id, mlx_format=False, total_bytes=sum(st.st_size for st in files.values()),
                         file_count=len(files), ignored=ignored)
        _classify(self.model_dir(model_id), files, info)
        if with_manifest:
            info.manifest = self.manifest(model_id)
        return info

    def list(self, with_manifest: bool = False) -> list[ModelInfo]:
        """Every model on the node (a directory vanishing meanwhile is skipped)."""
        out = []
        for model_id in self.ids():
            try:
                out.append(self.describe(model_id, with_manifest))
            except (ModelNotFound, InvalidName, OSError):
                continue
        return out


def _mlx_lm_supports(model_type: str) -> bool | None:
    """Whether mlx-lm has a module for this model_type; None when mlx-lm is not installed.

    Looks for the file instead of importing mlx_lm (0.7 s and 85 MB, which a report must not cost).
    """
    spec = find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        return None
    # mlx-lm imports models/<model_type>.py as named (lfm2-vl.py, lille-130m.py keep the dash), or the
    # module its remapping names (support.ALIASES mirrors it)
    names = {model_type, model_type.replace("-", "_"), ALIASES.get(model_type.replace("-", "_").lower(), "")} - {""}
    return any((Path(loc) / "models" / f"{name}.py").is_file()
               for loc in spec.submodule_search_locations for name in names)


def _classify(base: Path, files: dict[str, os.stat_result], info: ModelInfo) -> None:
    """Fill `info` from config.json and the file list; sets `reason` when not MLX-loadable."""
    if "config.json" not in files:
        info.reason = "no config.json"
        return
    try:
        cfg = json.loads((base / "config.json").read_text())
        if not isinstance(cfg, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        info.reason = f"config.json is not valid JSON ({exc})"
        return
    view = decoder_view(cfg)  # the stages' and the coordinator's reading (text_config, num_layers)
    info.model_type = view.get("model_type")
    archs = cfg.get("architectures")
    info.family = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else info.model_type
    # The registry's verdict on config.json alone, so a model of an unknown family or a
    # vision-language model is marked even when its tensors cannot be described.
    info.unsupported_reason = unsupported_reason(cfg)
    try:
        layers, hidden = layer_count(view), first_int(view, HIDDEN_KEYS)
    except ModelConfigError as exc:
        info.reason = str(exc)
        return
    info.num_layers = layers
    info.hidden_size = hidden[1] if hidden else None
    dtype = next((view[k] for k in ("torch_dtype", "dtype") if view.get(k) is not None), None)
    info.dtype = str(dtype) if dtype is not None else None
    quant = view.get("quantization") or view.get("quantization_config")
    if isinstance(quant, dict) and quant.get("bits"):
        group = f", group {quant['group_size']}" if quant.get("group_size") else ""
        info.quantization = f"{quant['bits']}-bit{group}"
    weights = [p for p in files if p.endswith(".safetensors")]
    if not weights:
        if any(p.endswith(".gguf") for p in files):
            info.reason = "GGUF weights: convert to an MLX directory first (safetensors)"
        elif any(p.endswith((".bin", ".pt", ".pth")) for p in files):
            info.reason = "PyTorch weights (.bin/.pt): convert with mlx_lm.convert first"
        else:
            info.reason = "no .safetensors weights"
        return
    index = files.get("model.safetensors.index.json")
    if index is not None:
        try:
            wanted = set(json.loads((base / "model.safetensors.index.json").read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            info.reason = "model.safetensors.index.json is not a valid index"
            return
        absent = sorted(w for w in wanted if w not in files)
        if absent:
            info.reason = f"weight shards named by the index are missing: {', '.join(absent)}"
            return
    if not isinstance(info.model_type, str):
        info.reason = "config.json has no model_type"
        return
    if info.num_layers is None or info.hidden_size is None:
        info.reason = "config.json lacks the layer count or hidden size"
        return
    if "tokenizer.json" not in files and "tokenizer.model" not in files:
        info.reason = "no tokenizer (tokenizer.json or tokenizer.model)"
        return
    if _mlx_lm_supports(info.model_type) is False:
        info.reason = f"model_type {info.model_type!r} is not supported by the installed mlx-lm"
        return
    try:
        info.description = describe_model(base)  # headers only: the planner's per-layer bytes
    except ModelDescriptionError as exc:
        info.reason = str(exc)
        return
    info.mlx_format = True
    info.supported = info.unsupported_reason is None
