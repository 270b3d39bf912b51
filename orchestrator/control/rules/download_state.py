"""Model downloads as the control plane tracks them (immutable, part of `State.downloads`).

One `ModelDownload` per model id: a hub repository fetched ONCE onto one node, and copied over
the LAN to the other target nodes file by file, each file as soon as that node has verified it
(`lan_copies`). One `ModelDeletion` per model deleted from a node.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

NodeDownloadStatus = Literal["waiting", "downloading", "copying", "verified", "failed", "cancelled"]
DownloadPhase = Literal["running", "done", "failed", "cancelled"]
DeletionPhase = Literal["running", "done", "failed"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class HubRef(_Frozen):
    """Where a model comes from on the hub."""

    repo_id: str
    revision: str = "main"

    @property
    def label(self) -> str:
        """"org/name" or "org/name@rev" for the dashboard."""
        return self.repo_id if self.revision == "main" else f"{self.repo_id}@{self.revision}"


class NodeDownload(_Frozen):
    """One target node's side of a model download."""

    node_id: str
    status: NodeDownloadStatus = "waiting"
    source: str = ""  # "hub org/name" or "LAN from node-a, node-b"
    done_bytes: int = 0
    total_bytes: int = 0
    rate_bps: float = 0.0
    eta_s: float | None = None  # time left at the current rate
    detail: str = ""


class ModelDownload(_Frozen):
    """A hub repository brought to several nodes: one hub download, LAN copies following it."""

    model_id: str
    hub: HubRef
    commit: str = ""  # pinned by the listing
    total_bytes: int = 0
    files: int = 0
    nodes: tuple[NodeDownload, ...] = ()
    phase: DownloadPhase = "running"
    error: str = ""
    started_at: float = 0.0

    def node(self, node_id: str) -> NodeDownload | None:
        """The entry of one target node."""
        return next((n for n in self.nodes if n.node_id == node_id), None)

    @property
    def finished(self) -> bool:
        """No worker runs for it any more."""
        return self.phase != "running"


class ModelDeletion(_Frozen):
    """A model being (or just) deleted from one node: while running, nothing may start on it."""

    model_id: str
    node_id: str
    phase: DeletionPhase = "running"
    error: str = ""
