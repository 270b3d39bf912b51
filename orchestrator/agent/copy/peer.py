"""Downloading a model's files from a peer agent, treating the peer as untrusted.

The peer is another node of the LAN, but the URL and ticket reach this agent through the
control plane, and whatever answers at that address may be anything. So:

- a file is read up to the manifest's size and no further: a peer that announces or sends
  more is an error for that file (not retried), so no peer can fill this node's disk;
- redirects are never followed (the ticket would travel to wherever they point); a
  redirect is an error;
- nothing of a foreign answer's body reaches the job's error or the log: an error names the
  HTTP status with a fixed message;
- a `.part` file is resumed with `Range` after a network error (a resume answered with the
  whole file restarts the file; both spend one budget of NETWORK_RETRIES per file); a file whose sha256
  differs is fetched again once from scratch (a file with per-block digests: only the
  block that differs), then the job fails as a mismatch naming the file (and the block
  and the peer).

The copy itself lives in `copier`: files (or byte ranges of large files) from several
peers at once, hashed by other threads while the bytes still arrive.
"""

from __future__ import annotations

import http.client
import os
import socket
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from orchestrator.agent.jobs import DownloadError
from orchestrator.agent.schemas import PeerSource

NETWORK_RETRIES = 3
TIMEOUT = (5, 30)  # connect, read (seconds)

# Fixed texts for the statuses a peer agent answers; anything else is "unexpected".
STATUS_TEXT = {
    401: "the peer refused the ticket (expired, or minted by another agent run)",
    403: "the peer refused the ticket for this model",
    404: "the peer does not have this file",
    416: "the peer refused the byte range",
}


def status_error(status: int, rel: str) -> DownloadError:
    """The job's error for a peer answer that is not the file: status and a fixed text, never the body."""
    if 300 <= status < 400:
        text, keep = "a redirect, which is not followed", False
    else:
        text = STATUS_TEXT.get(status, "an unexpected answer")
        # An expired ticket or a peer's passing trouble: a later fetch with a new ticket resumes.
        keep = status in (401, 403) or status >= 500
    return DownloadError(f"peer answered {status} for {rel}: {text}", "peer_error", keep_partial=keep)


def oversize_error(rel: str, size: int) -> DownloadError:
    """A peer that offers or sends more than the manifest's size for a file."""
    return DownloadError(f"the peer sent more than the manifest's {size} bytes for {rel}", "peer_error", [rel])


def network_reason(exc: BaseException) -> str:
    """Why a connection failed, in words of this machine's OS only.

    HTTP libraries' own messages may quote what the peer sent (a garbled status line), so only an
    errno found in the exception chain, a timeout, or the exception's type is reported.
    """
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        nested = [a for a in getattr(cur, "args", ()) if isinstance(a, BaseException)]
        cur = cur.__cause__ or cur.__context__ or getattr(cur, "reason", None) or (nested[0] if nested else None)
    for e in chain:
        if isinstance(e, OSError) and e.errno:
            return os.strerror(e.errno)
    if any(isinstance(e, (socket.timeout, TimeoutError)) for e in chain):
        return "timed out"
    if any(isinstance(e, http.client.IncompleteRead) for e in chain):
        return "connection ended early"
    return f"connection lost ({type(exc).__name__})"


@dataclass
class Peer:
    """One source of the files (the PeerSource or one of its mirrors)."""

    host: str
    port: int
    ticket: str
    base: str  # the path prefix of the model's files

    @classmethod
    def of(cls, url: str, ticket: str, model_id: str) -> "Peer":
        parts = urlsplit(url)
        return cls(parts.hostname or "", parts.port or 80, ticket, f"/v1/models/{quote(model_id, safe='')}/files/")


def peers_of(source: PeerSource, model_id: str) -> list[Peer]:
    """The source and its mirrors."""
    remote = source.model_id or model_id
    return [Peer.of(source.url, source.ticket, remote)] + [
        Peer.of(m.url, m.ticket, m.model_id or remote) for m in source.mirrors]
