"""The agent's HTTP API (docs/agent-api.md): routes, authentication, and error mapping.

Only GET /v1/identity and POST /v1/pair are open. Everything else needs
`Authorization: Bearer <credential>` from pairing; a request without it is refused before
its body is read, so it changes nothing. A file ticket (minted by a paired caller for one
model) can read that model's files and nothing else.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from orchestrator.agent.identity import CredentialsFull
from orchestrator.agent.inventory import ModelNotFound
from orchestrator.agent.jobs import Conflict, DiskSpaceError, DownloadError
from orchestrator.agent.names import InvalidName, check_id, check_model_id, check_relpath
from orchestrator.agent.perf_routes import routes as perf_routes
from orchestrator.agent.perf_routes import ticket_allows
from orchestrator.agent.processes import ProcessError
from orchestrator.agent.schemas import (
    CancelRequest,
    CheckRequest,
    DownloadList,
    FetchRequest,
    HubSource,
    LeaseRequest,
    LeaseResponse,
    LogsResponse,
    ModelList,
    PairRequest,
    PairResponse,
    ProcessList,
    StartProcessRequest,
    StopRequest,
    TicketRequest,
    TicketResponse,
)
from orchestrator.httpkit import App, Limits, OpenAIError, Request, Route, Server, Streamed, route

if TYPE_CHECKING:
    from orchestrator.agent.agent import Agent

MAX_BODY = 1 << 20  # the largest legitimate body is a start request with a 64 KiB TOML
SEND_CHUNK = 256 << 10
_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")  # 19 digits: any file size (more once gave a 500)

ID = r"(?P<{}>[^/]+)"
MODEL = r"/v1/models/" + ID.format("model_id")
PROC = r"/v1/processes/" + ID.format("cluster_id") + "/" + ID.format("node_id")


def _errors(fn: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """Map the agent's exceptions to HTTP errors (4xx with a message; nothing half-done)."""

    def wrapped(request: Request) -> Any:
        try:
            return fn(request)
        except InvalidName as exc:
            raise OpenAIError(400, str(exc), code="invalid_name") from None
        except DiskSpaceError as exc:
            raise OpenAIError(507, str(exc), code=exc.code) from None
        except Conflict as exc:
            raise OpenAIError(409, str(exc), code=exc.code) from None
        except DownloadError as exc:
            raise OpenAIError(400, str(exc), code=exc.code) from None
        except ProcessError as exc:
            raise OpenAIError(exc.status, str(exc), code=exc.code) from None
        except (ModelNotFound, LookupError) as exc:
            raise OpenAIError(404, str(exc.args[0] if exc.args else exc), code="not_found") from None

    return wrapped


def _unauthorized(message: str, code: str) -> OpenAIError:
    return OpenAIError(401, message, code=code, headers={"WWW-Authenticate": 'Bearer realm="pipeserve-agent"'})


def _int_query(request: Request, key: str, default: int, lo: int, hi: int) -> int:
    try:
        value = int(request.query.get(key, default))
    except ValueError:
        raise OpenAIError(400, f"{key} must be an integer") from None
    if not lo <= value <= hi:
        raise OpenAIError(400, f"{key} must be between {lo} and {hi}")
    return value


def build_routes(agent: "Agent") -> list[Route]:
    """Every route of the API, bound to `agent`."""

    def identity(_: Request) -> Any:
        return agent.identity()

    def pair(request: Request) -> Any:
        body = request.json(PairRequest)
        try:
            got = agent.state.pair(body.token, body.label)
        except CredentialsFull as exc:
            agent.log.warning("agent.pair_refused_full", client=request.handler.client_address[0])
            raise OpenAIError(409, str(exc), code="too_many_credentials") from None
        if got is None:
            time.sleep(0.25)  # slows guessing; the token has 192 random bits anyway
            agent.log.warning("agent.pair_refused", client=request.handler.client_address[0])
            raise _unauthorized("wrong pairing token", "invalid_pairing_token")
        credential, cred_id = got
        agent.log.info("agent.paired", credential_id=cred_id, label=body.label,
                       client=request.handler.client_address[0])
        return PairResponse(credential=credential, credential_id=cred_id, name=agent.config.name,
                            fingerprint=agent.state.fingerprint)

    def unpair(request: Request) -> Any:
        agent.state.unpair(request.context["caller"].id)
        return {"revoked": True}

    def report(_: Request) -> Any:
        return agent.report()

    def models(request: Request) -> Any:
        return ModelList(models=agent.inventory.list(with_manifest=request.query.get("manifest") in ("1", "true")))

    def model(request: Request) -> Any:
        return agent.inventory.describe(request.params["model_id"], with_manifest=True)

    def check(request: Request) -> Any:
        model_id = check_model_id(request.params["model_id"])
        body = request.json(CheckRequest)
        return agent.inventory.check(model_id, body.manifest, rehash=body.rehash)

    def ticket(request: Request) -> Any:
        model_id = request.params["model_id"]
        if not agent.downloads.running(check_model_id(model_id)):  # peers may follow a running download
            agent.inventory.model_dir(model_id)  # otherwise only for a model this node has
        body = request.json(TicketRequest)
        return TicketResponse(ticket=agent.state.issue_ticket(model_id, body.ttl_s), model_id=model_id,
                              expires_in_s=body.ttl_s)

    def fetch(request: Request) -> Any:
        model_id = check_model_id(request.params["model_id"])
        info, created = agent.downloads.start(model_id, request.json(FetchRequest))
        return (202 if created and info.state == "running" else 200), info

    def file(request: Request) -> Any:
        return _file_response(agent, request)

    def offered(request: Request) -> Any:
        return agent.downloads.offered(check_model_id(request.params["model_id"]))

    def downloads(_: Request) -> Any:
        return DownloadList(downloads=agent.downloads.list())

    def download(request: Request) -> Any:
        return agent.downloads.get(check_model_id(request.params["model_id"]))

    def cancel(request: Request) -> Any:
        model_id = check_model_id(request.params["model_id"])
        return agent.downloads.cancel(model_id, request.json(CancelRequest).discard)

    def delete_model(request: Request) -> Any:
        model_id = check_model_id(request.params["model_id"])
        agent.downloads.remove(model_id)
        return {"deleted": model_id}

    def hub_listing(request: Request) -> Any:
        from orchestrator.agent.hub import list_repo  # imports huggingface_hub: only when a hub is asked

        try:
            src = HubSource(kind="hf", repo_id=f"{request.params['org']}/{request.params['name']}",
                            revision=request.query.get("revision") or "main")
        except ValueError:  # pydantic's ValidationError
            raise OpenAIError(400, "repo id must be org/name and the revision a branch, tag or commit",
                              code="invalid_field") from None
        return list_repo(src.repo_id, src.revision, agent.inventory.root)

    def processes(_: Request) -> Any:
        return ProcessList(processes=agent.processes.list())

    def start_process(request: Request) -> Any:
        info = agent.processes.start(request.json(StartProcessRequest))
        return (201 if info.created else 200), info

    def process(request: Request) -> Any:
        return agent.processes.get(*_proc_key(request))

    def stop_process(request: Request) -> Any:
        key = _proc_key(request)
        return agent.processes.stop(*key, timeout_s=request.json(StopRequest).timeout_s)

    def logs(request: Request) -> Any:
        cluster_id, node_id = _proc_key(request)
        lines = _int_query(request, "lines", 100, 1, 2000)
        return LogsResponse(cluster_id=cluster_id, node_id=node_id,
                            lines=agent.processes.logs(cluster_id, node_id, lines))

    def lease(request: Request) -> Any:
        cluster_id = check_id(request.params["cluster_id"])
        body = request.json(LeaseRequest)
        return LeaseResponse(cluster_id=cluster_id, lease_s=body.lease_s,
                             renewed=agent.processes.renew(cluster_id, body.lease_s))

    table = [
        ("GET", r"/v1/identity", identity, "public"),
        ("POST", r"/v1/pair", pair, "public"),
        ("POST", r"/v1/unpair", unpair, "credential"),
        ("GET", r"/v1/report", report, "credential"),
        ("GET", r"/v1/models", models, "credential"),
        ("GET", MODEL, model, "credential"),
        ("DELETE", MODEL, delete_model, "credential"),
        ("POST", MODEL + r"/check", check, "credential"),
        ("POST", MODEL + r"/tickets", ticket, "credential"),
        ("POST", MODEL + r"/fetch", fetch, "credential"),
        ("GET", MODEL + r"/files", offered, "file"),
        ("GET", MODEL + r"/files/(?P<path>.+)", file, "file"),
        ("GET", r"/v1/hub/models/" + ID.format("org") + "/" + ID.format("name"), hub_listing, "credential"),
        ("GET", r"/v1/downloads", downloads, "credential"),
        ("GET", r"/v1/downloads/" + ID.format("model_id"), download, "credential"),
        ("POST", r"/v1/downloads/" + ID.format("model_id") + r"/cancel", cancel, "credential"),
        ("GET", r"/v1/processes", processes, "credential"),
        ("POST", r"/v1/processes", start_process, "credential"),
        ("GET", PROC, process, "credential"),
        ("POST", PROC + r"/stop", stop_process, "credential"),
        ("GET", PROC + r"/logs", logs, "credential"),
        ("POST", r"/v1/leases/" + ID.format("cluster_id"), lease, "credential"),
    ]
    table += perf_routes(agent)  # links and compute (perf_routes.py)
    return [route(method, pattern, _errors(fn), access) for method, pattern, fn, access in table]


def _proc_key(request: Request) -> tuple[str, str]:
    return check_id(request.params["cluster_id"]), check_id(request.params["node_id"])


def _open_served(agent: "Agent", model_id: str, rel: str) -> BinaryIO:
    """A file a peer may read: one the model's running download has verified, else the model's own."""
    check_relpath(rel)
    path = agent.downloads.offered_path(check_model_id(model_id), rel)
    if path is not None:
        try:
            return open(path, "rb")
        except FileNotFoundError:
            pass  # the download finished meanwhile: the file is in the model's directory now
    return open(agent.inventory.file_path(model_id, rel), "rb")


def _file_response(agent: "Agent", request: Request) -> Streamed:
    """A model file, whole or from a `Range: bytes=START-[END]` (206), for a peer's download."""
    f = _open_served(agent, request.params["model_id"], request.params["path"])
    try:
        size = os.fstat(f.fileno()).st_size
        start, end, status = 0, size - 1, 200
        header = request.header("Range")
        if header:
            m = _RANGE.fullmatch(header.strip())
            if not m:
                raise OpenAIError(416, f"unsupported Range {header[:64]!r}: use one 'bytes=START-[END]'",
                                  code="bad_range")
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or end < start:
                raise OpenAIError(416, f"range starts at {start}, the file has {size} bytes", code="bad_range")
            status = 206
    except BaseException:
        f.close()
        raise
    count = end - start + 1 if size else 0
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(count), "Accept-Ranges": "bytes"}
    if status == 206:
        headers["Content-Range"] = f"bytes {start}-{end}/{size}"

    def write(handler: Any) -> None:
        try:
            if agent.limiter is None:
                handler.connection.sendfile(f, start, count)  # zero-copy when the OS allows
            else:
                f.seek(start)
                left = count
                while left > 0:
                    block = f.read(min(SEND_CHUNK, left))
                    if not block:
                        break
                    agent.limiter.acquire(len(block))
                    handler.wfile.write(block)
                    left -= len(block)
        finally:
            f.close()

    return Streamed(status, headers, write)


def make_server(agent: "Agent") -> Server:
    """Bind the API on the agent's host and port."""

    def authorize(request: Request, access: str) -> None:
        if access == "public":
            return
        scheme, _, token = (request.header("Authorization") or "").partition(" ")
        caller = agent.state.caller(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if caller is None:
            raise _unauthorized("missing or invalid credential: pair with POST /v1/pair, then send "
                                "'Authorization: Bearer <credential>'", "unauthorized")
        if caller.kind == "ticket" and not ticket_allows(caller.model_id, access, request.params.get("model_id")):
            raise OpenAIError(403, f"this ticket only reads the files of model {caller.model_id!r}", code="forbidden")
        request.context["caller"] = caller

    # A request without Content-Length has an empty body (POST /v1/unpair), which reads as {}.
    app = App.of(build_routes(agent), MAX_BODY, authorize=authorize, empty_body_ok=True, log_hint="see the agent log")
    # Progress polling would flood the log: successful GETs are not logged (quiet_reads).
    return Server((agent.config.host, agent.config.port), app, agent.log, Limits().with_env(), name="pipeserve-agent",
                  quiet_reads=True)
