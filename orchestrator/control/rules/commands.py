"""Commands: what a user or a worker asks the control plane to do, as frozen values.

A command is decided on the orchestrator thread by the pure `decide.decide` (which holds
every rule) against the state of that moment; the Orchestrator's public methods only build
one and wait for the decision. Anything a command needs from outside the state — a paired
node, a new session id, the time — is done or drawn by the caller first and carried here,
so deciding stays pure. Also here: the refusal every command may raise, node addresses and
session ids.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from orchestrator.control.rules.state import Node, Session, Settings

if TYPE_CHECKING:
    from orchestrator.agent.hub import HubListing
    from orchestrator.control.rules.download_state import HubRef, ModelDownload

Split = tuple[tuple[int, int], ...]  # a manual split: inclusive (first, last) layer range per stage


class CommandRefused(ValueError):
    """A command that would break a rule; nothing changed. The message says why."""


@dataclass(frozen=True)
class UpdateSettings:
    """Store the distributed-serving settings."""

    settings: Settings


@dataclass(frozen=True)
class AddNode:
    """Add (or replace) a registered node; the caller has already paired with its agent."""

    node: Node


@dataclass(frozen=True)
class RemoveNode:
    """Forget a node."""

    node_id: str


@dataclass(frozen=True)
class PrepareModel:
    """Get a model onto every selected node (from a holder, or once from the hub)."""

    model_id: str
    node_ids: tuple[str, ...]
    hub: "HubRef | None" = None


@dataclass(frozen=True)
class PreviewPlan:
    """Plan (nothing starts) and show the result to every viewer; with `measure`, measure
    what the plan lacks afterwards and preview again."""

    model_id: str
    node_ids: tuple[str, ...]
    context_length: int = 4096
    concurrency: int = 4
    manual_split: Split | None = None
    measure: bool = True
    draft_model: str | None = None  # a model id that drafts for speculative decoding (on the coordinator's node)
    only_if_shown: bool = False  # a preview again after measuring: only while this plan is still the one shown


@dataclass(frozen=True)
class LaunchCluster:
    """Plan a cluster over the prepared nodes and launch it as session `session_id`."""

    model_id: str
    node_ids: tuple[str, ...]
    session_id: str
    now: float  # the session's created_at
    context_length: int = 4096
    concurrency: int = 4
    manual_split: Split | None = None
    draft_model: str | None = None  # a model id that drafts for speculative decoding (on the coordinator's node)


@dataclass(frozen=True)
class LaunchSingle:
    """Serve the whole model from one node as session `session_id`."""

    model_id: str
    node_id: str
    session_id: str
    now: float
    context_length: int = 4096  # the memory check's and the engine's bounds (planning.single_session)
    concurrency: int = 4


@dataclass(frozen=True)
class LaunchSession:
    """Launch a session whose placements are already made (`planning`, tests)."""

    session: Session
    model_id: str
    now: float


@dataclass(frozen=True)
class StopSession:
    """Stop a live session (cancel its launch, or tear it down)."""

    session_id: str


@dataclass(frozen=True)
class ResumeSession:
    """After a dashboard restart: what one look at a persisted session found (posted by the
    worker that looked), for `decide` to re-adopt, repair or clean it up."""

    session_id: str
    seen_phase: str  # the phase it had when looked at: a session that moved on since is left alone
    problem: str  # "" when the pipeline serves
    culprits: tuple[str, ...]  # the processes to replace for it ("stage-1", "coordinator")
    at: float
    gone: tuple[str, ...] = ()  # the processes that no longer run (ended, or their lease lapsed)


@dataclass(frozen=True)
class DownloadModel:
    """Download a hub repository once (onto the first node) and copy it over the LAN to the
    others. The caller has listed the repository as the first node sees the hub (I/O)."""

    model_id: str
    node_ids: tuple[str, ...]
    listing: "HubListing"
    now: float  # the download's started_at


@dataclass(frozen=True)
class ResumeDownload:
    """After a dashboard restart: follow a download that was running (the agents kept going)."""

    download: "ModelDownload"


@dataclass(frozen=True)
class CancelDownload:
    """Stop a running download on every node (partial files are dropped)."""

    model_id: str


@dataclass(frozen=True)
class ClearDownloads:
    """Clear the finished downloads from the Downloads list (running ones stay)."""


@dataclass(frozen=True)
class VerifyCopy:
    """Verify one node's copy of a model: the agent hashes every file again against its manifest."""

    model_id: str
    node_id: str


@dataclass(frozen=True)
class DeleteModel:
    """Delete a model from one node."""

    model_id: str
    node_id: str


Command = Union[UpdateSettings, AddNode, RemoveNode, PrepareModel, PreviewPlan, LaunchCluster, LaunchSingle,
                LaunchSession, StopSession, ResumeSession, DownloadModel, ResumeDownload, CancelDownload, DeleteModel,
                VerifyCopy, ClearDownloads]


def new_session_id() -> str:
    """A short unique id for a session (also its cluster id on the agents)."""
    return uuid.uuid4().hex[:12]
