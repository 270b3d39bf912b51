"""Models tab: download from the hub (once; LAN copies follow it), serve on one node, delete.

`ModelManager` belongs to the Orchestrator (`orch.models`). Its public methods do the I/O a
command needs first (the hub listing), then hand the command to the orchestrator thread,
where `model_rules` decides it against the state of that moment; the effects come back here:
a download runs in a worker thread that posts past-tense events (`download_events`), a
deletion asks the node's agent. Downloads in progress are also written to
`<state dir>/downloads.json` so a restarted dashboard resumes them (the agents keep their
partial files; a fetch of the same request continues them).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.agent.client import AgentError
from orchestrator.agent.hub import HubListing
from orchestrator.agent.names import InvalidName, check_model_id
from orchestrator.atomic_write import write_atomically
from orchestrator.control.capabilities import Capabilities
from orchestrator.control.fetching import FetchCancelled, FetchDetached, fetch_from_hub
from orchestrator.control.lan_copies import FollowingCopies
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import (
    CancelDownload,
    CommandRefused,
    DeleteModel,
    DownloadModel,
    ResumeDownload,
    VerifyCopy,
)
from orchestrator.control.rules.download_events import (
    ModelDeletionFinished,
    ModelDownloadFinished,
    ModelDownloadProgressed,
    ModelDownloadStarted,
)
from orchestrator.control.rules.download_state import HubRef, ModelDownload, NodeDownload
from orchestrator.control.rules.model_rules import reachable_name
from orchestrator.proc.wait import wait_until

if TYPE_CHECKING:
    from orchestrator.control.rules.state import Session, State

FILENAME = "downloads.json"
DELETE_WAIT_S = 60.0  # how long a delete waits for the agent's answer
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


class ModelManager:
    """Downloads, single-node serving and deletion, for one Orchestrator."""

    def __init__(self, caps: Capabilities, state_dir: Path,
                 launch_single: Callable[[str, str, int, int], Session]) -> None:
        self.caps = caps
        self._launch_single = launch_single  # the orchestrator's: a session id and the clock come with it
        self._cancels_lock = threading.Lock()  # the orchestrator thread adds flags, workers remove theirs
        self._file_lock = threading.Lock()  # workers record downloads
        self._cancels: dict[str, threading.Event] = {}
        self._detach = threading.Event()  # the dashboard stops: workers let go, the agents go on
        self._path = Path(state_dir) / FILENAME

    # --- commands ------------------------------------------------------------------------
    def hub_files(self, repo_id: str, revision: str, node_id: str) -> HubListing:
        """The repository's files and sizes as `node_id` sees the hub; nothing is downloaded."""
        hub = parse_hub_ref(repo_id, revision)
        reachable_name(self.caps.state(), node_id)
        client = self.caps.agent(node_id)
        if client is None:
            raise CommandRefused(f"node {node_id!r} is not registered")
        try:
            return client.hub_files(hub.repo_id, hub.revision)
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
        listing = self.hub_files(hub.repo_id, hub.revision, node_ids[0])  # I/O first; the rules decide on it
        decision = self.caps.command(DownloadModel(model_id, tuple(node_ids), listing, time.time()))
        return next(e.download for e in decision.events if isinstance(e, ModelDownloadStarted))

    def cancel(self, model_id: str) -> None:
        """Stop a running download on every node (partial files are dropped)."""
        self.caps.command(CancelDownload(model_id))

    def delete(self, model_id: str, node_id: str) -> None:
        """Delete a model from one node; refused while a session uses it there or it is downloading,
        or with the agent's reason when it refuses."""
        self.caps.command(DeleteModel(model_id, node_id))
        key = (model_id, node_id)
        try:
            state = self._wait(lambda st: any((d.model_id, d.node_id) == key and d.phase != "running"
                                                  for d in st.deletions), DELETE_WAIT_S)
        except TimeoutError:
            raise CommandRefused(f"delete {model_id}: the node has not answered within {DELETE_WAIT_S:g} s; "
                                 "the list shows the outcome when it does") from None
        done = next(d for d in state.deletions if (d.model_id, d.node_id) == key)
        if done.error:
            raise CommandRefused(done.error)

    def _wait(self, predicate: Callable[[State], bool], timeout: float) -> State:
        """The state once `predicate` holds (the orchestrator thread applies what workers post)."""
        wait_until(lambda: predicate(self.caps.state()), timeout, 0.02, message="the state's condition",
                   clock=self.caps.clock)
        return self.caps.state()

    def serve(self, model_id: str, node_id: str, context_length: int = 4096, concurrency: int = 4) -> "Session":
        """A single-node session: one stage with every layer plus the coordinator, one router backend
        (refused when it does not fit the node at this context length and concurrency)."""
        return self._launch_single(model_id, node_id, context_length, concurrency)

    # --- effects (model_rules decided them) -------------------------------------------------
    def run(self, dl: ModelDownload) -> None:
        """Run a download in its worker thread (on the orchestrator thread: nothing here blocks)."""
        cancel = threading.Event()
        with self._cancels_lock:
            self._cancels[dl.model_id] = cancel
        threading.Thread(target=self._run, args=(dl, cancel), name=f"model-download-{dl.model_id}",
                         daemon=True).start()

    def cancel_work(self, model_id: str) -> None:
        """Tell a running download's worker to stop."""
        with self._cancels_lock:
            flag = self._cancels.get(model_id)
        if flag is not None:
            flag.set()

    def delete_files(self, model_id: str, node_id: str) -> None:
        """A deletion's worker: the agent deletes the model; the node's report follows. It always
        ends with ModelDeletionFinished: a deletion left running would block the model there."""
        node = self.caps.state().node(node_id)
        name = node.name if node else node_id
        error = f"delete {model_id} on {name}: the node is no longer registered"
        try:
            client = self.caps.agent(node_id)
            if client is not None:
                client.delete_model(model_id)
                error = ""
                self._refresh(node_id)  # the list shows it gone as the deletion ends
        except AgentError as exc:
            error = f"delete {model_id} on {name}: {exc.message}"
        except Exception as exc:  # noqa: BLE001 (a bug must not leave the deletion running)
            if error:  # the delete failed; after a delete only the refresh can (the watcher reports it later)
                error = f"delete {model_id} on {name}: {type(exc).__name__}: {exc}"
        finally:
            self.caps.post(ModelDeletionFinished(model_id=model_id, node_id=node_id, error=error))

    def verify(self, model_id: str, node_id: str) -> None:
        """Verify one node's copy: its agent hashes every file again (the outcome arrives as events)."""
        self.caps.command(VerifyCopy(model_id, node_id))

    def check_files(self, model_id: str, node_id: str, reference: str | None) -> None:
        """A Verify's worker: the agent hashes every file again (sha256) against the manifest of the
        verified copy on `reference`, else its own; it always ends with CopyCheckFinished (a check
        left running would block Verify there)."""
        ok, message = False, f"{node_id}: the node is no longer registered"
        try:
            client, source = self.caps.agent(node_id), self.caps.agent(reference) if reference else None
            ref = self.caps.state().node(reference) if reference else None
            if client is not None:
                manifest = (source or client).model(model_id).manifest
                if manifest is None:
                    raise AgentError(502, f"no manifest of {model_id} from {ref.name if ref else 'the node'}")
                result = client.check(model_id, manifest, rehash=True)
                ok = result.status == "present"
                message = (f"checked by Verify against {ref.name}'s verified copy" if ref else
                           "checked by Verify: every file hashed again matches its manifest") if ok else result.message
        except AgentError as exc:
            message = exc.message
        except Exception as exc:  # noqa: BLE001 (a bug must not leave the check running)
            message = f"{type(exc).__name__}: {exc}"
        finally:
            self.caps.post(ev.CopyCheckFinished(model_id=model_id, node_id=node_id, ok=ok, message=message))

    def _refresh(self, node_id: str) -> None:
        """Post the node's report now (its models changed)."""
        client = self.caps.agent(node_id)
        try:
            if client is not None:
                self.caps.post(ev.NodeReported(node_id=node_id, report=client.report(), at=time.time()))
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
                self.caps.submit(ResumeDownload(dl))

    # --- the worker ----------------------------------------------------------------------

    def _save(self, dl: ModelDownload) -> None:
        """Record a download's latest view (downloads.json: the running ones and the last few)."""
        with self._file_lock:
            try:
                saved = {d["model_id"]: d for d in json.loads(self._path.read_text())}
            except (OSError, ValueError):
                saved = {}
            saved[dl.model_id] = dl.model_dump(mode="json")
            write_atomically(self._path, json.dumps(list(saved.values())[-16:]))

    def _run(self, dl: ModelDownload, cancel: threading.Event) -> None:
        self._save(dl)
        entries = {n.node_id: n for n in dl.nodes}
        names = {n.id: n.name for n in self.caps.state().nodes}

        def report(entry: NodeDownload) -> None:
            entries[entry.node_id] = entry
            self.caps.post(ModelDownloadProgressed(model_id=dl.model_id, node=entry))

        def settle(node_id: str, status: str, **changes: object) -> None:
            report(entries[node_id].model_copy(update={"status": status, "rate_bps": 0.0, "eta_s": None, **changes}))
            self._save(dl.model_copy(update={"nodes": tuple(entries.values())}))
            if status == "verified":
                self._refresh(node_id)  # the model shows in the node's list now, not at the next report

        phase, error = "done", ""
        try:
            # The hub node: the one that has it (a resumed download), else the first target.
            source = next((n for n, e in entries.items() if e.status == "verified"), next(iter(entries)))
            holder = self.caps.agent(source)
            copies = FollowingCopies(dl.model_id, holder, names.get(source, source),
                                     {n: self.caps.agent(n) for n, e in entries.items()
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
        self.caps.post(ModelDownloadFinished(model_id=dl.model_id, phase=phase, error=error))
        self._save(dl.model_copy(update={"nodes": tuple(entries.values()), "phase": phase, "error": error}))
        with self._cancels_lock:
            if self._cancels.get(dl.model_id) is cancel:
                del self._cancels[dl.model_id]

    def _from_hub(self, dl: ModelDownload, node_id: str, name: str, entries: dict[str, NodeDownload],
                  report: Callable[[NodeDownload], None], settle: Callable[..., None], cancel: threading.Event) -> None:
        """The hub node downloads the repository; _Failed (with the hub's reason) when it cannot."""
        settle(node_id, "downloading", source=f"hub {dl.hub.label}", detail="")
        try:
            info = fetch_from_hub(self.caps.agent(node_id), dl.model_id, dl.hub, entries[node_id], report, cancel,
                                  self._detach)
        except AgentError as exc:
            raise _Failed(f"hub download on {name} failed: {exc.message}") from None
        if info.state != "done":
            raise _Failed(f"hub download on {name} failed: {info.error or info.state}")
        settle(node_id, "verified", done_bytes=info.total_bytes, total_bytes=info.total_bytes,
               detail="downloaded from the hub, every file verified")


class _Failed(Exception):
    """A download cannot complete; the message says where and why."""
