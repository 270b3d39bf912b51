"""Downloading a model's files from a peer agent, treating the peer as untrusted.

The peer is another node of the LAN, but the URL and ticket reach this agent through the
control plane, and whatever answers at that address may be anything. So:

- a file is read up to the manifest's size and no further: a peer that announces or sends
  more is an error for that file (not retried), so no peer can fill this node's disk;
- redirects are never followed (the ticket would travel to wherever they point); a
  redirect is an error;
- nothing of a foreign answer's body reaches the job's error or the log: an error names the
  HTTP status with a fixed message;
- a `.part` file is resumed with `Range` after a network error; a file whose sha256
  differs is fetched again once from scratch, then the job fails as a mismatch.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import quote

import requests
import urllib3.exceptions

from ..logs import EventLogger
from .inventory import CHUNK
from .jobs import Cancelled, DownloadError, Job
from .schemas import PeerSource

NETWORK_RETRIES = 3
RECV_CHUNK = 4 << 20  # fewer Python-level iterations per byte: measurably faster than 1 MiB on loopback
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

    requests' own messages may quote what the peer sent (a garbled status line), so only an
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
    if any(isinstance(e, (requests.Timeout, TimeoutError, urllib3.exceptions.ReadTimeoutError)) for e in chain):
        return "timed out"
    return f"connection lost ({type(exc).__name__})"


def fetch_from_peer(job: Job, source: PeerSource, files_dir: Path, linked: set[str], log: EventLogger) -> None:
    """Bring every file of the job's manifest into `files_dir` (those in `linked` are already there)."""
    assert job.manifest is not None
    session = requests.Session()
    session.trust_env = False  # a LAN peer is reached directly, never through a proxy from the environment
    session.headers["Authorization"] = f"Bearer {source.ticket}"
    remote = source.model_id or job.model_id
    base = f"{source.url.rstrip('/')}/v1/models/{quote(remote, safe='')}/files/"
    try:
        for rel, entry in job.manifest.files.items():
            if job.cancel.is_set():
                raise Cancelled
            with job.lock:
                job.current_file = rel
            target = files_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() and target.stat().st_size == entry.size:
                # Renamed from .part only after verification (or linked from a verified local copy).
                job.file_done(entry.size, "reused" if rel in linked else "resumed")
                continue
            _fetch_file(job, session, base + quote(rel), target, rel, entry.size, entry.sha256, log)
    finally:
        session.close()


def _fetch_file(job: Job, session: requests.Session, url: str, target: Path, rel: str, size: int, sha256: str,
                log: EventLogger) -> None:
    part = target.with_name(target.name + ".part")
    for attempt in range(2):
        try:
            digest = _stream(job, session, url, part, rel, size, log)
        except DownloadError as exc:
            if not exc.keep_partial:
                part.unlink(missing_ok=True)
            raise
        if digest == sha256:
            os.replace(part, target)
            job.file_done(size)
            return
        part.unlink(missing_ok=True)
        with job.lock:
            job.current_bytes = 0
        log.warning("download.corrupt_file", model=job.model_id, file=rel, attempt=attempt + 1)
    raise DownloadError(f"mismatch: {rel} from the peer differs from the manifest (sha256 checked twice)",
                        "mismatch", [rel])


def _hash_existing(part: Path) -> "hashlib._Hash":
    digest = hashlib.sha256()
    with open(part, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            digest.update(block)
    return digest


def _stream(job: Job, session: requests.Session, url: str, part: Path, rel: str, size: int,
            log: EventLogger) -> str:
    """Fetch the file into `part`, resuming what is there; returns the sha256 of the whole file.

    Never writes `part` beyond `size` bytes.
    """
    failures = 0
    while True:
        offset = part.stat().st_size if part.exists() else 0
        if offset > size:
            part.unlink()
            offset = 0
        digest = _hash_existing(part) if offset else hashlib.sha256()
        if offset:
            with job.lock:
                job.current_bytes = offset
                job.resumed_bytes += offset if failures == 0 else 0
        if offset == size:
            return digest.hexdigest()
        try:
            with session.get(url, headers={"Range": f"bytes={offset}-"} if offset else {},
                             stream=True, timeout=TIMEOUT, allow_redirects=False) as r:
                if r.status_code == 206 and r.headers.get("Content-Range", "").startswith(f"bytes {offset}-"):
                    mode, expect = "ab", size - offset
                elif r.status_code == 200:
                    mode, expect, digest = "wb", size, hashlib.sha256()  # the peer ignored the range: start over
                    with job.lock:
                        job.current_bytes = 0
                else:
                    raise status_error(r.status_code, rel)
                declared = r.headers.get("Content-Length")
                if declared is not None and (not declared.strip().isdigit() or int(declared) > expect):
                    raise oversize_error(rel, size)  # refused before a byte is read
                with open(part, mode) as f:
                    got = 0
                    while got < expect:
                        # read1: what has arrived, so a cancel is seen even while a slow peer trickles
                        block = r.raw.read1(min(RECV_CHUNK, expect - got))
                        if not block:
                            break
                        if job.cancel.is_set():
                            raise Cancelled
                        f.write(block)
                        digest.update(block)
                        got += len(block)
                        job.transferred(len(block))
                    f.flush()
                    os.fsync(f.fileno())
                if got == expect and r.raw.read(1):  # one byte too many is enough to know
                    raise oversize_error(rel, size)
            if part.stat().st_size != size:
                raise requests.ConnectionError(f"connection ended at byte {part.stat().st_size} of {size}")
            return digest.hexdigest()
        except (requests.ConnectionError, requests.Timeout, urllib3.exceptions.HTTPError, OSError) as exc:
            if isinstance(exc, (FileNotFoundError, PermissionError)):
                raise
            failures += 1
            if failures > NETWORK_RETRIES:
                raise DownloadError(f"peer unreachable for {rel}: {network_reason(exc)}", "peer_unreachable",
                                    keep_partial=True) from None
            log.warning("download.retry", url=url, reason=network_reason(exc), attempt=failures)
            if job.cancel.wait(0.5 * failures):
                raise Cancelled from None
