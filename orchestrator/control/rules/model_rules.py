"""The Models tab's rules, as pure functions (`decide` hands its model commands here).

A download, a cancel and a deletion are each decided against the state of that moment on the
orchestrator thread, like every other command: two clicks cannot start two downloads of one
model, a name already taken on a node is refused before anything is fetched, every target must
have the disk room first, and a model cannot be deleted while a session uses it or a download
writes it (nor can a session start on, or a preparation copy to, a model being deleted there).
The answer is the events to apply and the effects (I/O, `effects.EffectRunner`) to run.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.agent.hub import HubListing
from orchestrator.agent.names import InvalidName, check_model_id
from orchestrator.control.rules.commands import (
    CancelDownload,
    CommandRefused,
    DeleteModel,
    DownloadModel,
    ResumeDownload,
    VerifyCopy,
)
from orchestrator.control.rules.download_events import ModelDeletionStarted, ModelDownloadStarted, deleting
from orchestrator.control.rules.download_state import HubRef, ModelDownload, NodeDownload
from orchestrator.control.rules.events import CopyCheckStarted
from orchestrator.control.rules.state import State
from orchestrator.control.rules.verification import verified_holders

DISK_MARGIN = 64 << 20  # what a node keeps free beyond the model (logs, caches)
ENDED = ("stopped", "failed")  # session phases that no longer use their nodes' models


# --- effects --------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunDownload:
    """Run a download in a worker: the hub node fetches it, the others follow with LAN copies."""

    download: ModelDownload


@dataclass(frozen=True)
class CancelDownloadWork:
    """Tell a running download's worker to stop (it drops partial files and reports)."""

    model_id: str


@dataclass(frozen=True)
class DeleteModelFiles:
    """Ask a node's agent to delete a model; the worker reports ModelDeletionFinished."""

    model_id: str
    node_id: str


@dataclass(frozen=True)
class CheckCopyFiles:
    """Have a node's agent hash every file of a model again against the manifest of the verified
    copy on `reference` (another node), or its own manifest when no other copy is verified."""

    model_id: str
    node_id: str
    reference: str | None


ModelEffect = RunDownload | CancelDownloadWork | DeleteModelFiles | CheckCopyFiles


def listing_refusal(listing: HubListing) -> str | None:
    """Why a listed repository cannot be downloaded here (None when it can)."""
    if not listing.mlx:
        return f"{listing.repo_id} is not an MLX model: {listing.reason}"
    if listing.gated and not listing.token:
        return (f"{listing.repo_id} is a gated repository and the node has no hub token: accept its terms on the "
                "Hub, then start the node's agent with HF_TOKEN set")
    return None


def running_download(state: State, model_id: str) -> ModelDownload | None:
    """The download of `model_id` that a worker still runs."""
    return next((d for d in state.downloads if d.model_id == model_id and not d.finished), None)


def reachable_name(state: State, node_id: str) -> str:
    """A target node's name; CommandRefused when it is not registered or not reachable."""
    node = state.node(node_id)
    if node is None:
        raise CommandRefused(f"node {node_id!r} is not registered")
    if node.status != "reachable":
        raise CommandRefused(f"node {node.name} is unreachable ({node.error or 'no report yet'})")
    return node.name


def name_problem(state: State, model_id: str, node_ids: tuple[str, ...] | list[str]) -> str | None:
    """What is wrong with the name a download would get on these nodes (None: nothing): not a
    valid model name, being downloaded already, or taken on a chosen node. The same rule answers
    the Name on the nodes field as it is typed and the download itself, before anything starts."""
    try:
        check_model_id(model_id)
    except InvalidName as exc:
        return f"model name: {exc}"
    if running_download(state, model_id) is not None:
        return f"{model_id} is already being downloaded: wait for it or cancel it"
    for nid in node_ids:
        node = state.node(nid)
        if node is not None and node.report and any(m.id == model_id for m in node.report.models):
            return (f"{node.name} already has a model named {model_id}: delete it first, "
                    "or give the download another name")
    return None


# --- decisions ------------------------------------------------------------------------------
def decide_download(state: State, c: DownloadModel) -> tuple[tuple, tuple[ModelEffect, ...]]:
    """A download to start: (events, effects), or CommandRefused naming the first broken rule."""
    if not c.node_ids:
        raise CommandRefused("choose at least one node to download to")
    for nid in c.node_ids:
        reachable_name(state, nid)
    problem = name_problem(state, c.model_id, c.node_ids)
    if problem:
        raise CommandRefused(problem)
    listing = c.listing
    refusal = listing_refusal(listing)
    if refusal:
        raise CommandRefused(refusal)
    for nid in c.node_ids:  # before anything is fetched: every target must have the room
        node = state.node(nid)
        free = node.report.disk_free_bytes if node.report else 0
        if listing.total_bytes + DISK_MARGIN > free:
            raise CommandRefused(f"not enough disk space on {node.name}: {listing.repo_id} needs "
                                 f"{listing.total_bytes / 1e6:.1f} MB (+{DISK_MARGIN >> 20} MiB margin), "
                                 f"{free / 1e6:.1f} MB are free")
    dl = ModelDownload(model_id=c.model_id, hub=HubRef(repo_id=listing.repo_id, revision=listing.revision),
                       commit=listing.commit, total_bytes=listing.total_bytes, files=len(listing.files),
                       started_at=c.now,
                       nodes=tuple(NodeDownload(node_id=n, total_bytes=listing.total_bytes,
                                                detail="waiting for the hub download" if i else "")
                                   for i, n in enumerate(c.node_ids)))
    return (ModelDownloadStarted(download=dl),), (RunDownload(dl),)


def decide_resume(state: State, c: ResumeDownload) -> tuple[tuple, tuple[ModelEffect, ...]]:
    """Follow a download again after a restart (unless one of that model already runs)."""
    if c.download.finished or running_download(state, c.download.model_id) is not None:
        return (), ()
    return (ModelDownloadStarted(download=c.download),), (RunDownload(c.download),)


def decide_cancel(state: State, c: CancelDownload) -> tuple[tuple, tuple[ModelEffect, ...]]:
    """Cancel a running download."""
    if running_download(state, c.model_id) is None:
        raise CommandRefused(f"no download of {c.model_id} is running")
    return (), (CancelDownloadWork(c.model_id),)


def decide_delete(state: State, c: DeleteModel) -> tuple[tuple, tuple[ModelEffect, ...]]:
    """Delete a model from a node: refused while a session uses it there, a download writes it,
    or it is being deleted already."""
    node = state.node(c.node_id)
    name = node.name if node else c.node_id
    users = [s.name for s in state.sessions if s.model_id == c.model_id and c.node_id in s.node_ids
             and s.phase not in ENDED]
    if users:
        raise CommandRefused(f"{c.model_id} on {name} is used by session {', '.join(users)}: stop it first")
    dl = running_download(state, c.model_id)
    if dl is not None and dl.node(c.node_id):
        raise CommandRefused(f"{c.model_id} is being downloaded to {name}: cancel the download first")
    if deleting(state, c.model_id, c.node_id):
        raise CommandRefused(f"{c.model_id} is already being deleted from {name}")
    reachable_name(state, c.node_id)
    return (ModelDeletionStarted(model_id=c.model_id, node_id=c.node_id),), (DeleteModelFiles(c.model_id, c.node_id),)


def decide_verify(state: State, c: VerifyCopy) -> tuple[tuple, tuple[ModelEffect, ...]]:
    """Verify a copy, against another node's verified copy when there is one: refused while it is
    downloading, being deleted or already being verified."""
    name = reachable_name(state, c.node_id)
    node = state.node(c.node_id)
    info = next((m for m in node.report.models if m.id == c.model_id), None) if node and node.report else None
    if info is None:
        raise CommandRefused(f"{name} has no model {c.model_id}")
    if any(d.model_id == c.model_id and not d.finished for d in state.downloads):
        raise CommandRefused(f"{c.model_id} is being downloaded: it is verified as it arrives")
    if deleting(state, c.model_id, c.node_id):
        raise CommandRefused(f"{c.model_id} is being deleted from {name}")
    if any((k.model_id, k.node_id, k.phase) == (c.model_id, c.node_id, "running") for k in state.checks):
        raise CommandRefused(f"{c.model_id} on {name} is already being verified")
    others = sorted(verified_holders(state, c.model_id) - {c.node_id})
    reference = next((n for n in others if (r := state.node(n)) is not None and r.status == "reachable"), None)
    return (CopyCheckStarted(model_id=c.model_id, node_id=c.node_id),), (CheckCopyFiles(c.model_id, c.node_id,
                                                                                         reference),)


def deletion_conflict(state: State, model_id: str, node_ids: tuple[str, ...] | list[str]) -> str | None:
    """Why a session of `model_id` cannot start on these nodes now (None when it can)."""
    for nid in node_ids:
        if deleting(state, model_id, nid):
            node = state.node(nid)
            return f"{model_id} is being deleted from {node.name if node else nid}"
    return None
