"""What the orchestrator's commands share: their refusal, node addresses, session ids."""

from __future__ import annotations

import socket
import uuid
from urllib.parse import urlsplit


class CommandRefused(ValueError):
    """A command that would break a rule; nothing changed. The message says why."""


def agent_url(address: str) -> str:
    """Normalise "host:port" or "http://host:port" to http://IP:port (engine addresses are IP literals)."""
    text = address.strip()
    parts = urlsplit(text if "://" in text else f"http://{text}")
    if parts.scheme != "http" or not parts.hostname or not parts.port or parts.path not in ("", "/"):
        raise CommandRefused(f"address {address!r}: expected host:port of a node agent, e.g. 192.168.1.20:39500")
    try:
        ip = socket.gethostbyname(parts.hostname)
    except OSError:
        raise CommandRefused(f"address {address!r}: cannot resolve {parts.hostname!r}") from None
    return f"http://{ip}:{parts.port}"


def new_session_id() -> str:
    """A short unique id for a session (also its cluster id on the agents)."""
    return uuid.uuid4().hex[:12]
