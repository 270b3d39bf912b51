"""Models tab commands: download from the hub (once; LAN copies follow it), serve on one node, delete.

`ModelManager` belongs to the Orchestrator (`orch.models`). Its commands check what they can
against the latest state and refuse with `CommandRefused`; a download then runs in a worker
thread that posts past-tense events (`download_events`). Downloads in progress are also
written to `<state dir>/downloads.json` so a restarted dashboard resumes them (the agents
keep their partial files; a fetch of the same request continues them).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..agent.client import AgentClient, AgentError
from ..agent.hub import HubListing
from ..agent.names import InvalidName, check_model_id
from . import events as ev
from .commands import CommandRefused
from .download_events import ModelDownloadFinished, ModelDownloadProgressed, ModelDownloadStarted
from .download_state import HubRef, ModelDownload, NodeDownload
from .fetching import FetchCancelled, FetchDetached, fetch_from_hub
from .lan_copies import FollowingCopies

if TYPE_CHECKING:
    from .core import Orchestrator
    from .state import Session

FILENAME = "downloads.json"
DISK_MARGIN = 64 << 20  # what a node keeps free beyond the model (logs, caches)
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def default_model_id(repo_id: str) -> str:
    """The model id a repository gets on the nodes: its name part ("org/Name-4bit" -> "Name-4bit")."""
    return repo_id.rsplit("/", 1)[-1]


def parse_hub_ref(repo_id: str, revision: str = "") -> HubRef:
    """A validated HubRef; CommandRefused names the problem."""
    repo_id, revision = repo_id.strip(), (revision or "").strip() or "main"
    if not _REPO.fullmatch(repo_id):
        raise CommandRefused(f"hub repo id {repo_id!r}: expected org/name, e.g. mlx-community/SmolLM2-135M-Instruct")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}", revision):
        raise CommandRefused(f"revision {revision!r}: a branch, tag or commit")
    return HubRef(repo_id=repo_id, revision=revision)


def listing_refusal(listing: HubListing) -> str | None:
    """Why a listed repository cannot be downloaded here (None when it can)."""
    if not listing.mlx:
        return f"{listing.repo_id} is not an MLX model: {listing.reason}"
    if listing.gated and not listing.token:
        return (f"{listing.repo_id} is a gated repository and the node has no hub token: accept its terms on the "
                "Hub, then start the node's agent with HF_TOKEN set")
    return None


class ModelManager:
    """Downloads, single-node serving and deletion, for one Orchestrator."""

    def __init__(self, orch: "Orchestrator") -> None:
        self.orch = orch
        self._lock = threading.Lock()  # one command at a time: two clicks cannot start two downloads
        self._file_lock = threading.Lock()  # workers and commands both record downloads
        self._cancels: dict[str, threading.Event] = {}
        self._detach = threading.Event()  # the dashboard stops: workers let go, the agents go on
        self._path = Path(orch.state_dir) / FILENAME

    # --- commands ------------------------------------------------------------------------
    def _client(self, node_id: str) -> AgentClient:
        node = self.orch.state.node(node_id)
        client = self.orch.agent(node_id)
        if node is None or client is None:
            raise CommandRefused(f"node {node_id!r} is not registered")
        if node.status != "reachable":
            raise CommandRefused(f"node {node.name} is unreachable ({node.error or 'no report yet'})")
        return client

    def hub_files(self, repo_id: str, revision: str, node_id: str) -> HubListing:
        """The repository's files and sizes as `node_id` sees the hub; nothing is downloaded."""
        hub = parse_hub_ref(repo_id, revision)
        try:
            return self._client(node_id).hub_files(hub.repo_id, hub.revision)
        except AgentError as exc:
            raise CommandRefused(exc.message) from None

    def download(self, repo_id: str, revision: str, node_ids: list[str], model_id: str = "") -> ModelDownload:
        """Download a hub repository once (onto the first node); the others copy each of its files over the
        LAN as soon as the first node has verified it."""
        hub = parse_hub_ref(repo_id, revision)
        try:
            model_id = check_model_id(model_id.strip() or default_model_id(hub.repo_id))
        except InvalidName as exc:
            raise CommandRefused(f"model name: {exc}") from None
        node_ids = list(dict.fromkeys(node_ids))
        if not node_ids:
            raise CommandRefused("choose at least one node to download to")
        with self._lock:
            state = self.orch.state
            running = next((d for d in state.downloads if d.model_id == model_id and not d.finished), None)
            if running is not None:
                raise CommandRefused(f"{model_id} is already being downloaded: wait for it or cancel it")
            for nid in node_ids:
                self._client(nid)
                node = state.node(nid)
                if node.report and any(m.id == model_id for m in node.report.models):
                    raise CommandRefused(f"{node.name} already has a model named {model_id}: delete it first, "
                                         "or give the download another name")
            listing = self.hub_files(hub.repo_id, hub.revision, node_ids[0])
            refusal = listing_refusal(listing)
            if refusal:
                raise CommandRefused(refusal)
            for nid in node_ids:  # before anything is fetched: every target must have the room
                node = state.node(nid)
                free = node.report.disk_free_bytes if node.report else 0
                if listing.total_bytes + DISK_MARGIN > free:
                    raise CommandRefused(f"not enough disk space on {node.name}: {listing.repo_id} needs "
                                         f"{listing.total_bytes / 1e6:.1f} MB (+{DISK_MARGIN >> 20} MiB margin), "
                                         f"{free / 1e6:.1f} MB are free")
            dl = ModelDownload(model_id=model_id, hub=hub, commit=listing.commit, total_bytes=listing.total_bytes,
                               files=len(listing.files), started_at=time.time(),
                               nodes=tuple(NodeDownload(node_id=n, total_bytes=listing.total_bytes,
                                                        detail="waiting for the hub download" if i else "")
                                           for i, n in enumerate(node_ids)))
            self._begin(dl)
        try:  # answer once every viewer's state has it (the action renders it at once)
            self.orch.wait(lambda st: any(d.model_id == model_id and d.started_at == dl.started_at
                                          for d in st.downloads), 5)
        except TimeoutError:
            pass  # the live push brings it
        return dl

    def cancel(self, model_id: str) -> None:
        """Stop a running download on every node (partial files are dropped)."""
        with self._lock:
            flag = self._cancels.get(model_id)
            if flag is None:
                raise CommandRefused(f"no download of {model_id} is running")
            flag.set()

    def delete(self, model_id: str, node_id: str) -> None:
        """Delete a model from one node; refused while a session uses it there or it is downloading."""
        state = self.orch.state
        name = state.node(node_id).name if state.node(node_id) else node_id
        users = [s.name for s in state.sessions if s.model_id == model_id and node_id in s.node_ids
                 and s.phase not in ("stopped", "failed")]
        if users:
            raise CommandRefused(f"{model_id} on {name} is used by session {', '.join(users)}: stop it first")
        if any(d.model_id == model_id and not d.finished and d.node(node_id) for d in state.downloads):
            raise CommandRefused(f"{model_id} is being downloaded to {name}: cancel the download first")
        try:
            self._client(node_id).delete_model(model_id)
        except AgentError as exc:
            raise CommandRefused(f"delete {model_id} on {name}: {exc.message}") from None
        self._refresh(node_id)

    def serve(self, model_id: str, node_id: str) -> "Session":
        """A single-node session: one stage with every layer plus the coordinator, one router backend."""
        return self.orch.launch_single(model_id, node_id)

    def _refresh(self, node_id: str) -> None:
        """Post the node's report now (its models changed)."""
        client = self.orch.agent(node_id)
        try:
            if client is not None:
                self.orch.post(ev.NodeReported(node_id=node_id, report=client.report(), at=time.time()))
        except AgentError:
            pass  # the watcher's next look reports it

    def stop(self) -> None:
        """Let go of the running downloads without cancelling them (a restart resumes them)."""
        self._detach.set()

    def resume(self) -> None:
        """After a dashboard restart: continue the downloads that were running."""
        try:
            saved = [ModelDownload.model_validate(d) for d in json.loads(self._path.read_text())]
        except (OSError, ValueError):
            return
        for dl in saved:
            if not dl.finished:
                self._begin(dl)

    # --- the worker ----------------------------------------------------------------------
    def _begin(self, dl: ModelDownload) -> None:
        cancel = threading.Event()
        self._cancels[dl.model_id] = cancel
        self.orch.post(ModelDownloadStarted(download=dl))
        self._save(dl)
        threading.Thread(target=self._run, args=(dl, cancel), name=f"model-download-{dl.model_id}",
                         daemon=True).start()

    def _save(self, dl: ModelDownload) -> None:
        """Record a download's latest view (downloads.json: the running ones and the last few)."""
        with self._file_lock:
            try:
                saved = {d["model_id"]: d for d in json.loads(self._path.read_text())}
            except (OSError, ValueError):
                saved = {}
            saved[dl.model_id] = dl.model_dump(mode="json")
            fd, tmp = tempfile.mkstemp(dir=self._path.parent, prefix=".downloads-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(list(saved.values())[-16:]))
            os.replace(tmp, self._path)

    def _run(self, dl: ModelDownload, cancel: threading.Event) -> None:
        entries = {n.node_id: n for n in dl.nodes}
        names = {n.id: n.name for n in self.orch.state.nodes}

        def report(entry: NodeDownload) -> None:
            entries[entry.node_id] = entry
            self.orch.post(ModelDownloadProgressed(model_id=dl.model_id, node=entry))

        def settle(node_id: str, status: str, **changes: object) -> None:
            report(entries[node_id].model_copy(update={"status": status, "rate_bps": 0.0, "eta_s": None, **changes}))
            self._save(dl.model_copy(update={"nodes": tuple(entries.values())}))
            if status == "verified":
                self._refresh(node_id)  # the model shows in the node's list now, not at the next report

        phase, error = "done", ""
        try:
            # The hub node: the one that has it (a resumed download), else the first target.
            source = next((n for n, e in entries.items() if e.status == "verified"), next(iter(entries)))
            holder = self.orch.agent(source)
            copies = FollowingCopies(dl.model_id, holder, names.get(source, source),
                                     {n: self.orch.agent(n) for n, e in entries.items()
                                      if n != source and e.status != "verified"},
                                     names, entries, report, settle, cancel, self._detach)

            def hub_report(entry: NodeDownload) -> None:
                report(entry)
                copies.start()  # the hub node's job runs: the others copy each file once it is verified there

            try:
                if entries[source].status != "verified":
                    self._from_hub(dl, source, names.get(source, source), entries, hub_report, settle, cancel)
                copies.start()
                copies.source_done(holder.model(dl.model_id).manifest)
            except BaseException:
                if not self._detach.is_set():
                    cancel.set()  # stops every copy following the hub node; the hub's reason is reported for all
                copies.join()
                raise
            failures = copies.join()
            if self._detach.is_set():
                raise FetchDetached
            if cancel.is_set():
                raise FetchCancelled
            if failures:
                raise _Failed("; ".join(failures))
        except FetchDetached:
            return  # recorded as running: the next dashboard start follows it again
        except FetchCancelled:
            phase, error = "cancelled", "cancelled"
        except (_Failed, AgentError) as exc:
            phase, error = "failed", str(exc.message if isinstance(exc, AgentError) else exc)
        except Exception as exc:  # noqa: BLE001 (a node removed meanwhile, a bug: fail visibly, never hang)
            phase, error = "failed", f"{type(exc).__name__}: {exc}"
        for n, e in list(entries.items()):
            if e.status not in ("verified", "failed") and phase != "done":
                settle(n, "cancelled" if phase == "cancelled" else "failed",
                       detail=e.detail if phase == "cancelled" else error)
        self.orch.post(ModelDownloadFinished(model_id=dl.model_id, phase=phase, error=error))
        self._save(dl.model_copy(update={"nodes": tuple(entries.values()), "phase": phase, "error": error}))
        with self._lock:
            if self._cancels.get(dl.model_id) is cancel:
                del self._cancels[dl.model_id]

    def _from_hub(self, dl: ModelDownload, node_id: str, name: str, entries: dict[str, NodeDownload],
                  report: Callable[[NodeDownload], None], settle: Callable[..., None], cancel: threading.Event) -> None:
        """The hub node downloads the repository; _Failed (with the hub's reason) when it cannot."""
        settle(node_id, "downloading", source=f"hub {dl.hub.label}", detail="")
        try:
            info = fetch_from_hub(self.orch.agent(node_id), dl.model_id, dl.hub, entries[node_id], report, cancel,
                                  self._detach)
        except AgentError as exc:
            raise _Failed(f"hub download on {name} failed: {exc.message}") from None
        if info.state != "done":
            raise _Failed(f"hub download on {name} failed: {info.error or info.state}")
        settle(node_id, "verified", done_bytes=info.total_bytes, total_bytes=info.total_bytes,
               detail="downloaded from the hub, every file verified")


class _Failed(Exception):
    """A download cannot complete; the message says where and why."""
