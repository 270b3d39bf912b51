"""Following an agent's download job to its end, through agent restarts (the I/O edge).

Shared by the Models tab's downloads and by Prepare on all nodes: a job is started (or
joined: a fetch of the same request is idempotent), polled, and started again when the
agent came back without it (restarted: the fetch resumes from the partial files it kept)
or stopped it while shutting down. Only the control plane's own cancel ends it early.
"""

from __future__ import annotations

import threading
from typing import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.job_follower import JobCancelled, JobTimeout, follow_job
from orchestrator.agent.schemas import DownloadInfo
from orchestrator.control.rules.download_state import HubRef, NodeDownload

Report = Callable[[NodeDownload], None]
RESTART_WAIT_S = 1.0


class FetchCancelled(Exception):
    """The control plane cancelled the download."""


class FetchDetached(Exception):
    """The control plane is stopping: the agent's job goes on, a restarted dashboard follows it again."""


def progress_entry(base: NodeDownload, info: DownloadInfo) -> NodeDownload:
    """A node's entry from its job's progress: bytes, rate and time left (pure)."""
    left = max(0, (info.total_bytes or base.total_bytes) - info.done_bytes)
    eta = left / info.rate_bps if info.rate_bps > 0 else None
    # A copy following a hub download learns the size from its source: until then, the listing's size.
    return base.model_copy(update={"done_bytes": info.done_bytes, "total_bytes": info.total_bytes or base.total_bytes,
                                   "rate_bps": info.rate_bps, "eta_s": None if eta is None else round(eta, 1),
                                   "detail": info.current_file or ""})


def follow(client: AgentClient, model_id: str, start: Callable[[], DownloadInfo], entry: NodeDownload,
           report: Report, cancel: threading.Event, poll_s: float = 0.25, timeout_s: float = 6 * 3600,
           detach: threading.Event | None = None) -> DownloadInfo:
    """Run one node's job to its end and return its final info (done, failed, or cancelled by the agent's
    user); FetchCancelled when `cancel` is set (the job is then cancelled on the agent, partial files dropped),
    FetchDetached when `detach` is (the job goes on)."""
    started = False

    def poll() -> DownloadInfo | None:
        """The job's state, or None while it must be (re)started; the restart rules of this module."""
        nonlocal started
        if detach is not None and detach.is_set():
            raise FetchDetached
        try:
            info = client.progress(model_id) if started else start()
            started = True
        except AgentError as exc:
            if exc.status == 0:  # the agent is down (restarting?): wait for it
                report(entry.model_copy(update={"detail": "agent unreachable: waiting for it to come back"}))
                cancel.wait(RESTART_WAIT_S)
                return None
            if exc.status == 404 and started:  # it came back without the job: fetch again (resumes)
                started = False
                return None
            raise
        if info.state == "cancelled" and not cancel.is_set():  # stopped by the agent's shutdown
            started = False
            cancel.wait(RESTART_WAIT_S)
            return None
        return info

    try:
        return follow_job(poll, f"download of {model_id}", timeout_s, poll_s, cancel=cancel,
                          on_running=lambda info: report(progress_entry(entry, info)))
    except JobCancelled:
        try:
            client.cancel(model_id, discard=True)
        except AgentError:
            pass  # gone or never started: nothing to stop there
        raise FetchCancelled from None
    except JobTimeout as exc:
        raise AgentError(408, str(exc), "timeout") from None


def hub_source(hub: HubRef) -> dict[str, str]:
    """The agent's fetch source for a hub repository."""
    return {"kind": "hf", "repo_id": hub.repo_id, "revision": hub.revision}


def fetch_from_hub(client: AgentClient, model_id: str, hub: HubRef, entry: NodeDownload, report: Report,
                   cancel: threading.Event, detach: threading.Event | None = None) -> DownloadInfo:
    """One node downloads the repository from the hub."""
    return follow(client, model_id, lambda: client.fetch(model_id, hub_source(hub)), entry, report, cancel,
                  detach=detach)


def follow_over_lan(client: AgentClient, model_id: str, holder: AgentClient, entry: NodeDownload, report: Report,
                    cancel: threading.Event, detach: threading.Event | None = None) -> DownloadInfo:
    """One node copies each file the holder has verified while the holder still downloads the model, until
    the holder has all of it (a fresh ticket at each (re)start, valid as long as a hub download may take)."""
    return follow(client, model_id, lambda: client.follow_peer(model_id, holder, ttl_s=86400), entry, report,
                  cancel, detach=detach)
