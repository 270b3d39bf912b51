"""The Hugging Face Hub as the agent sees it: a repo's file list before anything is fetched,
whether it is an MLX model this node could use, and the Hub's errors in plain words.

huggingface_hub is imported inside the functions (it is only needed when a hub is used)
and honours `HF_ENDPOINT` (a mirror, or the tests' stand-in) and `HF_TOKEN` (gated repos).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from pydantic import BaseModel

from orchestrator import settings
from orchestrator.agent.jobs import DownloadError
from orchestrator.agent.names import InvalidName, check_relpath
from orchestrator.families.support import unsupported_reason

MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KB; the preview reads at most this much


class HubFile(BaseModel):
    """One file of a hub repository as its listing gives it."""

    path: str
    size: int
    sha256: str | None = None  # LFS files: the content's sha256
    blob_id: str | None = None  # small (git) files: the git blob sha1 of the content


class HubListing(BaseModel):
    """What a download would fetch, known before a byte of it is: GET /v1/hub/models/{repo}."""

    repo_id: str
    revision: str
    commit: str  # every file comes from this one commit
    files: list[HubFile]
    skipped: list[str] = []  # names this agent would not write (unsafe paths)
    total_bytes: int
    gated: bool = False
    token: bool = False  # whether this agent has a hub token (HF_TOKEN or a login)
    mlx: bool  # an MLX model directory by its file list (config, safetensors, tokenizer)
    reason: str | None = None  # why not, when mlx is false
    model_type: str | None = None
    unsupported_reason: str | None = None  # the engine's support registry on its config.json
    disk_free_bytes: int
    fits: bool  # the files fit on this node's models disk


def endpoint() -> str | None:
    """HF_ENDPOINT read now (not when huggingface_hub was imported): None means the real Hub."""
    return settings.HF_ENDPOINT.read()


def has_token() -> bool:
    """Whether huggingface_hub would send a token (HF_TOKEN, or a saved login)."""
    from huggingface_hub import get_token

    return bool(get_token())


def hub_error(exc: BaseException, repo_id: str, revision: str) -> DownloadError:
    """The Hub's (or its HTTP client's) exception as one clear DownloadError."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint() or "https://huggingface.co"
    if isinstance(exc, GatedRepoError):  # a subclass of RepositoryNotFoundError: first
        return DownloadError(f"{repo_id} is a gated repository: accept its terms on the Hub, then give the agent a "
                             "token with access (HF_TOKEN in its environment)", "hub_gated")
    if isinstance(exc, RevisionNotFoundError):
        return DownloadError(f"{repo_id} has no revision {revision!r} on {where}", "hub_not_found")
    if isinstance(exc, RepositoryNotFoundError):
        return DownloadError(f"no repository {repo_id} on {where} (or it is private and the agent's token "
                             "cannot see it)", "hub_not_found")
    if isinstance(exc, EntryNotFoundError):
        return DownloadError(f"{repo_id}@{revision}: a listed file is missing on {where}", "hub_error")
    if isinstance(exc, HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        return DownloadError(f"the hub {where} answered {status} for {repo_id}", "hub_error", keep_partial=True)
    # Connection refused, reset, timeouts: huggingface_hub resumes its .incomplete files next time.
    return DownloadError(f"hub {where} unreachable ({type(exc).__name__})", "hub_unreachable", keep_partial=True)


def mlx_verdict(paths: list[str]) -> str | None:
    """Why a repo with these files is not an MLX model directory (None when it looks like one)."""
    names = set(paths)
    if "config.json" not in names:
        return "no config.json: not a model repository"
    if not any(p.endswith(".safetensors") for p in paths):
        if any(p.endswith(".gguf") for p in paths):
            return "GGUF weights only: not an MLX repository (look for an mlx-community conversion)"
        if any(p.endswith((".bin", ".pt", ".pth")) for p in paths):
            return "PyTorch weights only: not an MLX repository (convert it with mlx_lm.convert first)"
        return "no .safetensors weights: not an MLX repository"
    if "tokenizer.json" not in names and "tokenizer.model" not in names:
        return "no tokenizer (tokenizer.json or tokenizer.model)"
    return None


def list_repo(repo_id: str, revision: str, models_root: Path, read_config: bool = True) -> HubListing:
    """The repo's files at `revision` (pinned to its commit) and what this node makes of them."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=endpoint()).model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 (mapped to one clear error)
        raise hub_error(exc, repo_id, revision) from None
    files: list[HubFile] = []
    skipped: list[str] = []
    for s in info.siblings or []:
        try:
            path = check_relpath(s.rfilename)
        except InvalidName:
            skipped.append(s.rfilename)
            continue
        files.append(HubFile(path=path, size=s.size or 0, sha256=s.lfs.sha256 if s.lfs else None,
                             blob_id=getattr(s, "blob_id", None)))
    reason = mlx_verdict([f.path for f in files])
    model_type = unsupported = None
    commit = info.sha or revision
    gated, token = bool(getattr(info, "gated", False)), has_token()
    listed_config = next((f.size for f in files if f.path == "config.json"), 0)
    if reason is None and listed_config > MAX_CONFIG_BYTES:
        reason = f"config.json is {listed_config} bytes: too large for a model configuration"
    if reason is None and read_config and not (gated and not token):
        # config.json is a few KB: read it to tell supported from unsupported before the weights
        # come — in memory, at most MAX_CONFIG_BYTES whatever the hub sends (a 198 MiB one once
        # landed in the system temp directory).
        try:
            cfg = json.loads(_read_config(repo_id, commit))
            model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
            unsupported = unsupported_reason(cfg) if isinstance(cfg, dict) else "config.json is not an object"
        except DownloadError as exc:
            if exc.code != "oversized":
                raise
            reason = f"config.json is over {MAX_CONFIG_BYTES} bytes: too large for a model configuration"
        except ValueError:
            reason = "config.json is not valid JSON"
        except Exception as exc:  # noqa: BLE001
            err = hub_error(exc, repo_id, revision)
            if err.code != "hub_gated":  # gated: the listing says so, the token decides at download
                raise err from None
            gated = True
    total = sum(f.size for f in files)
    free = _disk_free(models_root)
    return HubListing(repo_id=repo_id, revision=revision, commit=commit, files=files, skipped=skipped,
                      total_bytes=total, gated=gated, token=token,
                      mlx=reason is None, reason=reason, model_type=model_type, unsupported_reason=unsupported,
                      disk_free_bytes=free, fits=total + (16 << 20) <= free)


def _read_config(repo_id: str, commit: str) -> bytes:
    """config.json of the repo at `commit`, read into memory and capped at MAX_CONFIG_BYTES."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    from orchestrator.agent.capped import CappedWriter

    buf = io.BytesIO()
    http_get(hf_hub_url(repo_id, "config.json", revision=commit, endpoint=endpoint()),
             CappedWriter(buf, MAX_CONFIG_BYTES, "config.json"), headers=build_hf_headers())
    return buf.getvalue()


def _disk_free(root: Path) -> int:
    import shutil

    return shutil.disk_usage(root).free
