"""The agent's performance routes (docs/agent-api.md, "Links and compute").

- `POST /v1/links/tickets` (credential): a probe ticket for this node, which a peer sends
  to `/v1/links/echo` and which opens nothing else;
- `GET|POST /v1/links/echo` (credential or probe ticket): a tiny answer, or the size of the
  body it read (at most the agent's 1 MiB body limit);
- `POST /v1/links/echo-port` (credential or probe ticket): open a one-connection echo at the
  given address of this node on a free port of its transport range (linkecho.py), the path a
  stage's predecessor dials;
- `POST /v1/links/measure` (credential): probe the given peers now and periodically;
- `GET /v1/links` (credential): the last samples;
- `GET|POST /v1/models/{id}/profile` (credential): the cached timing of a model's layers, or
  start timing it (202 while it runs).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from orchestrator.agent.linkecho import EchoUnavailable, open_echo
from orchestrator.agent.perf_schemas import LinkList, MeasureLinksRequest
from orchestrator.agent.schemas import TicketRequest, TicketResponse
from orchestrator.httpkit import OpenAIError, Request

if TYPE_CHECKING:
    from orchestrator.agent.agent import Agent

# A probe ticket is a file ticket for this pseudo model: no model id can contain ':', so it
# reads no files, and only the echo route accepts it.
PROBE_SCOPE = ":links"
MODEL = r"/v1/models/(?P<model_id>[^/]+)"
ECHO_MAX_FRAME = 1 << 20  # what a probe sends at most (MeasureLinksRequest.payload_bytes)
ECHO_SLOTS = 2  # link echoes open at once (peers probing together); the stages keep the rest of the range


class EchoPortRequest(BaseModel):
    host: str = Field(min_length=1, max_length=64)


def ticket_allows(model_scope: str | None, access: str, model_id: str | None) -> bool:
    """Whether a ticket for `model_scope` may use a route with this access (pure)."""
    if access == "probe":
        return model_scope == PROBE_SCOPE
    return access == "file" and model_scope != PROBE_SCOPE and model_id == model_scope


def routes(agent: "Agent") -> list[tuple[str, str, Any, str]]:
    """(method, pattern, handler, access) of every performance route, bound to `agent`."""

    echo_slots = threading.BoundedSemaphore(ECHO_SLOTS)  # this agent's, for its server's lifetime

    def links_ticket(request: Request) -> Any:
        body = request.json(TicketRequest)
        return TicketResponse(ticket=agent.state.issue_ticket(PROBE_SCOPE, body.ttl_s), model_id=PROBE_SCOPE,
                              expires_in_s=body.ttl_s)

    def echo(request: Request) -> Any:
        return {"ok": True, "bytes": len(request.body_bytes()) if request.method == "POST" else 0}

    def echo_port(request: Request) -> Any:
        host = request.json(EchoPortRequest).host
        try:
            port, nonce = open_echo(host, agent.config.transport_ports, ECHO_MAX_FRAME, echo_slots)
        except EchoUnavailable as exc:
            raise OpenAIError(409, f"cannot open a link echo: {exc}") from None
        except (OSError, ValueError) as exc:
            raise OpenAIError(400, f"cannot open a link echo at {host!r}: {exc}") from None
        return {"host": host, "port": port, "nonce": nonce}

    def measure(request: Request) -> Any:
        return LinkList(links=agent.links.measure(request.json(MeasureLinksRequest)))

    def links(_: Request) -> Any:
        return LinkList(links=agent.links.links())

    def profile(request: Request) -> Any:
        return agent.compute.status(request.params["model_id"])

    def start_profile(request: Request) -> Any:
        status = agent.compute.start(request.params["model_id"], force=request.query.get("force") in ("1", "true"))
        return (202 if status.state == "running" else 200), status

    return [
        ("POST", r"/v1/links/tickets", links_ticket, "credential"),
        ("GET", r"/v1/links/echo", echo, "probe"),
        ("POST", r"/v1/links/echo", echo, "probe"),
        ("POST", r"/v1/links/echo-port", echo_port, "probe"),
        ("POST", r"/v1/links/measure", measure, "credential"),
        ("GET", r"/v1/links", links, "credential"),
        ("GET", MODEL + r"/profile", profile, "credential"),
        ("POST", MODEL + r"/profile", start_profile, "credential"),
    ]
