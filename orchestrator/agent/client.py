"""`AgentClient`: the control plane's side of the agent API (docs/agent-api.md).

Every method returns the parsed response model or raises AgentError with the HTTP status,
the agent's message and its error code. Transport failures (agent unreachable) are
AgentError with status 0, so callers handle one exception type.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import requests
from pydantic import BaseModel

if TYPE_CHECKING:
    from orchestrator.agent.hub import HubListing

from orchestrator.agent.job_follower import JobTimeout, follow_job
from orchestrator.agent.perf_schemas import LinkList, LinkSample, MeasureLinksRequest, ProfileStatus
from orchestrator.agent.schemas import (
    CheckResult,
    DownloadInfo,
    DownloadList,
    Identity,
    LeaseResponse,
    LogsResponse,
    Manifest,
    ModelInfo,
    ModelList,
    OfferedFiles,
    PairResponse,
    ProcessInfo,
    ProcessList,
    Report,
    StartProcessRequest,
    TicketResponse,
)

M = TypeVar("M", bound=BaseModel)


class AgentError(Exception):
    """An agent refused or failed a request (status 0: it could not be reached)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status, self.message, self.code = status, message, code


def transport_reason(exc: requests.RequestException) -> str:
    """A short, readable reason for a failed request (not urllib3's nested repr)."""
    text = str(exc)
    if isinstance(exc, requests.Timeout):
        return "no answer in time (is the address right and the node up?)"
    for needle, reason in (("Connection refused", "connection refused (is `pipeserve agent` running on that port?)"),
                           ("Name or service not known", "unknown host name"),
                           ("nodename nor servname", "unknown host name"),
                           ("No route to host", "no route to host"),
                           ("Network is unreachable", "network unreachable"),
                           ("Connection reset", "connection reset"),
                           ("RemoteDisconnected", "the agent closed the connection")):
        if needle in text:
            return reason
    return text[:200]


class AgentClient:
    """Talks to one agent at `base_url` ("http://host:port"), with the credential from pairing."""

    def __init__(self, base_url: str, credential: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.credential = credential
        self.timeout = timeout
        self._session = requests.Session()
        self._session.trust_env = False  # agents are on the LAN: never through an environment proxy

    def close(self) -> None:
        """Close pooled connections."""
        self._session.close()

    def _call(self, method: str, path: str, body: Any = None, model: type[M] | None = None,
              params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.credential}"} if self.credential else {}
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json", exclude_none=True)
        try:
            r = self._session.request(method, self.base_url + path, json=body, params=params, headers=headers,
                                      timeout=timeout or self.timeout)
        except requests.RequestException as exc:
            raise AgentError(0, f"agent {self.base_url} unreachable: {transport_reason(exc)}", "unreachable") from None
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise AgentError(r.status_code, str(err.get("message") or r.text[:300]), err.get("code"))
        return model.model_validate(data) if model else data

    # --- identity and pairing ------------------------------------------------------

    def identity(self) -> Identity:
        """GET /v1/identity (no credential needed)."""
        return self._call("GET", "/v1/identity", model=Identity)

    def pair(self, token: str, label: str = "") -> PairResponse:
        """Exchange the pairing token for a credential, which this client then uses."""
        resp = self._call("POST", "/v1/pair", {"token": token, "label": label}, PairResponse)
        self.credential = resp.credential
        return resp

    def unpair(self) -> None:
        """Revoke this client's credential."""
        self._call("POST", "/v1/unpair")

    def report(self) -> Report:
        """The node report (accelerator, versions, memory, ports, models, processes, downloads)."""
        return self._call("GET", "/v1/report", model=Report)

    # --- models --------------------------------------------------------------------

    def models(self, manifests: bool = False) -> list[ModelInfo]:
        """The node's models (with manifests when asked: hashing may take a while the first time)."""
        return self._call("GET", "/v1/models", params={"manifest": "1"} if manifests else None,
                          model=ModelList).models

    def model(self, model_id: str) -> ModelInfo:
        """One model, with its manifest."""
        return self._call("GET", f"/v1/models/{_q(model_id)}", model=ModelInfo, timeout=600)

    def check(self, model_id: str, manifest: Manifest, rehash: bool = False) -> CheckResult:
        """Present / needs_download / mismatch against `manifest`."""
        return self._call("POST", f"/v1/models/{_q(model_id)}/check",
                          {"manifest": manifest.model_dump(), "rehash": rehash}, CheckResult, timeout=600)

    prepare = check  # the dashboard's word for it

    def ticket(self, model_id: str, ttl_s: int = 3600) -> TicketResponse:
        """A read-only ticket for this model's files, to hand to a peer."""
        return self._call("POST", f"/v1/models/{_q(model_id)}/tickets", {"ttl_s": ttl_s}, TicketResponse)

    def fetch(self, model_id: str, source: dict[str, Any], manifest: Manifest | None = None) -> DownloadInfo:
        """Start (or join) a download; `source` is {"kind": "peer"|"hf"|"demo", ...}."""
        body: dict[str, Any] = {"source": source}
        if manifest is not None:
            body["manifest"] = manifest.model_dump()
        return self._call("POST", f"/v1/models/{_q(model_id)}/fetch", body, DownloadInfo, timeout=600)

    def fetch_from_peer(self, model_id: str, peer: "AgentClient", manifest: Manifest | None = None,
                        ttl_s: int = 3600) -> DownloadInfo:
        """Fetch from another agent: mint a ticket there, then ask this agent to download with it.

        `manifest` is what the files must match (the control plane's reference); by default
        the peer's own manifest is taken.
        """
        manifest = manifest or peer.model(model_id).manifest
        ticket = peer.ticket(model_id, ttl_s).ticket
        return self.fetch(model_id, {"kind": "peer", "url": peer.base_url, "ticket": ticket}, manifest)

    def hub_files(self, repo_id: str, revision: str = "main") -> "HubListing":
        """The hub repo's files, sizes and verdicts (MLX, supported, fits this node), before any download."""
        from orchestrator.agent.hub import HubListing

        return self._call("GET", f"/v1/hub/models/{repo_id}", params={"revision": revision}, model=HubListing,
                          timeout=120)

    def delete_model(self, model_id: str) -> None:
        """Delete a model from the node (409 model_in_use while a process uses it)."""
        self._call("DELETE", f"/v1/models/{_q(model_id)}")

    def fetch_from_peers(self, model_id: str, peers: list["AgentClient"], manifest: Manifest,
                         ttl_s: int = 3600) -> DownloadInfo:
        """Fetch from several agents holding the same files at once (a ticket minted at each);
        the first is the source, the others its mirrors."""
        first, *rest = peers
        source: dict[str, Any] = {"kind": "peer", "url": first.base_url, "ticket": first.ticket(model_id, ttl_s).ticket}
        if rest:
            source["mirrors"] = [{"url": p.base_url, "ticket": p.ticket(model_id, ttl_s).ticket} for p in rest]
        return self.fetch(model_id, source, manifest)

    def follow_peer(self, model_id: str, peer: "AgentClient", ttl_s: int = 3600) -> DownloadInfo:
        """Copy the model from `peer` while the peer still downloads it: each file once the peer has
        verified it, until the peer holds the whole model."""
        source = {"kind": "peer", "url": peer.base_url, "ticket": peer.ticket(model_id, ttl_s).ticket, "follow": True}
        return self.fetch(model_id, source)

    def offered(self, model_id: str) -> OfferedFiles:
        """The files this node serves to peers: all once it holds the model, else those verified so far."""
        return self._call("GET", f"/v1/models/{_q(model_id)}/files", model=OfferedFiles)

    def progress(self, model_id: str) -> DownloadInfo:
        """The latest download of a model."""
        return self._call("GET", f"/v1/downloads/{_q(model_id)}", model=DownloadInfo)

    def downloads(self) -> list[DownloadInfo]:
        """Every model's latest download."""
        return self._call("GET", "/v1/downloads", model=DownloadList).downloads

    def cancel(self, model_id: str, discard: bool = False) -> DownloadInfo:
        """Cancel a download (partial files kept for a resume unless `discard`)."""
        return self._call("POST", f"/v1/downloads/{_q(model_id)}/cancel", {"discard": discard}, DownloadInfo)

    def wait_download(self, model_id: str, timeout: float = 600.0, poll_s: float = 0.1) -> DownloadInfo:
        """Poll until the download is done, failed or cancelled; AgentError(408) on timeout."""
        try:
            return follow_job(lambda: self.progress(model_id), f"download of {model_id}", timeout, poll_s)
        except JobTimeout as exc:
            raise AgentError(408, str(exc), "timeout") from None

    # --- links and compute (perf_routes.py) ----------------------------------------

    def links_ticket(self, ttl_s: int = 3600) -> str:
        """A probe ticket for this node, to hand to the peers that measure their link to it."""
        return self._call("POST", "/v1/links/tickets", {"ttl_s": ttl_s})["ticket"]

    def measure_links(self, peers: list[dict[str, Any]], **options: Any) -> list[LinkSample]:
        """Probe these peers ({node_id, name, url, ticket}) now, and periodically from then on."""
        body = MeasureLinksRequest.model_validate({"peers": peers, **options})
        return self._call("POST", "/v1/links/measure", body, LinkList, timeout=max(self.timeout, 60.0)).links

    def links(self) -> list[LinkSample]:
        """The last measurement to each peer."""
        return self._call("GET", "/v1/links", model=LinkList).links

    def profile(self, model_id: str, start: bool = False, force: bool = False) -> ProfileStatus:
        """The timing of a model's layers on this node; `start` times it when not cached."""
        return self._call("POST" if start else "GET", f"/v1/models/{_q(model_id)}/profile",
                          params={"force": "1"} if force else None, model=ProfileStatus)

    # --- processes -----------------------------------------------------------------

    def start_process(self, request: StartProcessRequest | dict[str, Any]) -> ProcessInfo:
        """Start a stage or coordinator (idempotent per cluster id + node id)."""
        req = request if isinstance(request, StartProcessRequest) else StartProcessRequest.model_validate(request)
        return self._call("POST", "/v1/processes", req, ProcessInfo)

    def processes(self) -> list[ProcessInfo]:
        """Every engine process the agent knows."""
        return self._call("GET", "/v1/processes", model=ProcessList).processes

    def process(self, cluster_id: str, node_id: str) -> ProcessInfo:
        """One process's status."""
        return self._call("GET", f"/v1/processes/{_q(cluster_id)}/{_q(node_id)}", model=ProcessInfo)

    def stop_process(self, cluster_id: str, node_id: str, timeout_s: float = 10.0) -> ProcessInfo:
        """SIGTERM, then SIGKILL after `timeout_s`; returns once the process is gone."""
        return self._call("POST", f"/v1/processes/{_q(cluster_id)}/{_q(node_id)}/stop", {"timeout_s": timeout_s},
                          ProcessInfo, timeout=timeout_s + 30)

    def renew_lease(self, cluster_id: str, lease_s: float = 30.0) -> LeaseResponse:
        """Extend the lease of the cluster's processes on this node (404 when none runs)."""
        return self._call("POST", f"/v1/leases/{_q(cluster_id)}", {"lease_s": lease_s}, LeaseResponse)

    def logs(self, cluster_id: str, node_id: str, lines: int = 100) -> list[str]:
        """The last lines a process printed."""
        return self._call("GET", f"/v1/processes/{_q(cluster_id)}/{_q(node_id)}/logs", params={"lines": lines},
                          model=LogsResponse).lines


def _q(part: str) -> str:
    return quote(part, safe="")
