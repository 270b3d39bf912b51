"""Events of model downloads and deletions (past tense) and how they change the state (pure)."""

from __future__ import annotations

from typing import ClassVar, Literal

from orchestrator.control.rules.download_state import DownloadPhase, ModelDeletion, ModelDownload, NodeDownload
from orchestrator.control.rules.event_base import Event
from orchestrator.control.rules.state import State

KEPT = 8  # finished downloads kept for the dashboard (running ones are always kept)


class ModelDownloadStarted(Event):
    """A download was requested (or resumed after a dashboard restart)."""

    kind: Literal["model_download_started"] = "model_download_started"
    persisted: ClassVar[bool] = False  # downloads.json is models.py's own record
    download: ModelDownload


class ModelDownloadProgressed(Event):
    """A target node's status or byte counts changed."""

    kind: Literal["model_download_progressed"] = "model_download_progressed"
    persisted: ClassVar[bool] = False  # downloads.json is models.py's own record
    model_id: str
    node: NodeDownload


class ModelDownloadListed(Event):
    """The hub's listing pinned the commit and the size."""

    kind: Literal["model_download_listed"] = "model_download_listed"
    persisted: ClassVar[bool] = False  # downloads.json is models.py's own record
    model_id: str
    commit: str
    total_bytes: int
    files: int


class ModelDownloadFinished(Event):
    """Every target is verified, or the download failed or was cancelled."""

    kind: Literal["model_download_finished"] = "model_download_finished"
    persisted: ClassVar[bool] = False  # downloads.json is models.py's own record
    model_id: str
    phase: DownloadPhase
    error: str = ""


class DownloadsCleared(Event):
    """The finished downloads were cleared from the list (running ones stay)."""

    kind: Literal["downloads_cleared"] = "downloads_cleared"
    persisted: ClassVar[bool] = False  # downloads.json is models.py's own record


class ModelDeletionStarted(Event):
    """A model's deletion from a node was accepted (nothing may start on it until it ends)."""

    kind: Literal["model_deletion_started"] = "model_deletion_started"
    persisted: ClassVar[bool] = False  # a restart asks the agent again, which knows
    model_id: str
    node_id: str


class ModelDeletionFinished(Event):
    """The node deleted the model (`error` empty) or refused to, saying why."""

    kind: Literal["model_deletion_finished"] = "model_deletion_finished"
    persisted: ClassVar[bool] = False
    model_id: str
    node_id: str
    error: str = ""


def _replace(state: State, model_id: str, fn) -> State:
    downloads = tuple(fn(d) if d.model_id == model_id else d for d in state.downloads)
    return state.model_copy(update={"downloads": downloads})


def apply_download(state: State, e: Event) -> State:
    """The state after a download or deletion event (unknown models change nothing)."""
    if isinstance(e, ModelDownloadStarted):
        others = tuple(d for d in state.downloads if d.model_id != e.download.model_id)
        done = [d for d in others if d.finished]
        drop = {id(d) for d in done[:max(0, len(done) - KEPT)]}
        return state.model_copy(update={"downloads": tuple(d for d in others if id(d) not in drop) + (e.download,)})
    if isinstance(e, ModelDownloadProgressed):
        return _replace(state, e.model_id, lambda d: d.model_copy(update={"nodes": tuple(
            e.node if n.node_id == e.node.node_id else n for n in d.nodes)}))
    if isinstance(e, ModelDownloadListed):
        return _replace(state, e.model_id, lambda d: d.model_copy(update={
            "commit": e.commit, "total_bytes": e.total_bytes, "files": e.files}))
    if isinstance(e, DownloadsCleared):
        running = tuple(d for d in state.downloads if not d.finished)
        return state if len(running) == len(state.downloads) else state.model_copy(update={"downloads": running})
    if isinstance(e, ModelDownloadFinished):
        return _replace(state, e.model_id, lambda d: d.model_copy(update={"phase": e.phase, "error": e.error}))
    if isinstance(e, ModelDeletionStarted | ModelDeletionFinished):
        others = tuple(d for d in state.deletions if (d.model_id, d.node_id) != (e.model_id, e.node_id))
        if isinstance(e, ModelDeletionStarted):
            entry = ModelDeletion(model_id=e.model_id, node_id=e.node_id)
        elif len(others) == len(state.deletions):
            return state  # no deletion of it was started
        else:
            entry = ModelDeletion(model_id=e.model_id, node_id=e.node_id, phase="failed" if e.error else "done",
                                  error=e.error)
        done = [d for d in others if d.phase != "running"]
        drop = {id(d) for d in done[:max(0, len(done) - KEPT)]}
        return state.model_copy(update={"deletions": tuple(d for d in others if id(d) not in drop) + (entry,)})
    return state


def deleting(state: State, model_id: str, node_id: str) -> bool:
    """Whether the model is being deleted from the node right now."""
    return any(d.model_id == model_id and d.node_id == node_id and d.phase == "running" for d in state.deletions)
