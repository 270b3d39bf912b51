"""The LAN copies of a Models-tab download: every other target node follows the hub node's download.

Each copying node asks its agent to follow the hub node (`fetch` with a `follow` peer source):
the agent copies each file as soon as the hub node has verified it, while the hub download
still runs, so the last node is done shortly after the hub node instead of a whole copy
later. Once the hub node holds the whole model, each copy is checked against the hub node's
manifest (the reference, as for any LAN copy) before the node counts as verified.

A copying node whose source went away for a moment (the hub node's agent restarted, not yet
asked to fetch again) follows it again; a hub download that fails stops every copy, and the
download's worker reports the hub's reason for all of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.schemas import Manifest
from orchestrator.control.fetching import FetchCancelled, FetchDetached, Report, follow_over_lan
from orchestrator.control.rules.download_state import NodeDownload

Settle = Callable[..., None]
# The follower's errors that mean "the source is not there right now": while the hub download runs, try again.
TRANSIENT = frozenset({"source_failed", "peer_unreachable"})
RETRY_WAIT_S = 1.0


class FollowingCopies:
    """One thread per copying node; `source_done` hands them the hub node's manifest, `join` waits for all."""

    def __init__(self, model_id: str, holder: AgentClient, holder_name: str, clients: dict[str, AgentClient],
                 names: dict[str, str], entries: dict[str, NodeDownload], report: Report, settle: Settle,
                 cancel: threading.Event, detach: threading.Event) -> None:
        self.model_id, self.holder, self.holder_name = model_id, holder, holder_name
        self.clients, self.names, self.entries = clients, names, entries
        self.report, self.settle, self.cancel, self.detach = report, settle, cancel, detach
        self.failures: list[str] = []
        self._manifest: Manifest | None = None
        self._source_done = threading.Event()
        self._lock = threading.Lock()
        self._started = False
        self._threads = [threading.Thread(target=self._copy, args=(n,), daemon=True, name=f"lan-copy-{n[:8]}")
                         for n in clients]

    def start(self) -> None:
        """Every copying node starts following the hub node now (once: later calls change nothing)."""
        with self._lock:
            if self._started:
                return
            self._started = True
        for n in self.clients:
            self.settle(n, "copying", source=f"LAN from {self.holder_name}", detail=self._waiting)
        for t in self._threads:
            t.start()

    def source_done(self, manifest: Manifest) -> None:
        """The hub node holds the whole model, verified: the copies are checked against this."""
        self._manifest = manifest
        self._source_done.set()

    def join(self) -> list[str]:
        """Wait for every copy (none when they never started); the failures, "node: why"."""
        with self._lock:
            started = self._started
        for t in self._threads if started else ():
            t.join()
        return self.failures

    @property
    def _waiting(self) -> str:
        return f"copying each file once {self.holder_name} has verified it"

    def _stopped(self) -> bool:
        return self.cancel.is_set() or self.detach.is_set()

    def _discard(self, client: AgentClient) -> None:
        """Drop the partial files a stopped follower kept for a resume (none will come: the download ends)."""
        if self.detach.is_set():
            return  # the dashboard stops, the download does not: a restarted one resumes them
        try:
            client.cancel(self.model_id, discard=True)
        except AgentError:
            pass  # the agent is gone: its partial files wait for the next fetch, which replaces them

    def _copy(self, node_id: str) -> None:
        client, name = self.clients[node_id], self.names.get(node_id, node_id)

        def report(entry: NodeDownload) -> None:
            self.report(entry if entry.detail else entry.model_copy(update={"detail": self._waiting}))

        try:
            while True:
                try:
                    info = follow_over_lan(client, self.model_id, self.holder, self.entries[node_id], report,
                                           self.cancel, self.detach)
                except AgentError as exc:  # the hub node's agent has no job yet (restarted, not asked again)
                    if exc.status != 404 or self._source_done.is_set():
                        raise
                    if self.cancel.wait(RETRY_WAIT_S) or self._stopped():
                        self._discard(client)
                        return
                    continue
                if info.state == "done":
                    break
                if info.error_code in TRANSIENT and not self._source_done.is_set():
                    if self.cancel.wait(RETRY_WAIT_S) or self._stopped():
                        self._discard(client)
                        return  # the hub download failed or was cancelled: the worker says why
                    continue
                why = info.error or info.state
                self.failures.append(f"{name}: {why}")
                self.settle(node_id, "failed", detail=why)
                return
            while not self._source_done.wait(0.2):  # the agent is done only once the hub node is: a moment
                if self._stopped():
                    return
            assert self._manifest is not None
            check = client.check(self.model_id, self._manifest)
        except AgentError as exc:
            self.failures.append(f"{name}: {exc.message}")
            self.settle(node_id, "failed", detail=exc.message)
            return
        except (FetchCancelled, FetchDetached):
            return
        if check.status == "present":
            self.settle(node_id, "verified", done_bytes=self._manifest.total_bytes,
                        total_bytes=self._manifest.total_bytes, detail="copied over the LAN, verified")
        else:
            self.failures.append(f"{name}: {check.message}")
            self.settle(node_id, "failed", detail=check.message)
