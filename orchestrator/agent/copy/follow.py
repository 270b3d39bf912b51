"""A LAN copy that follows a peer's own download: each file is copied once the peer has verified it.

When several nodes need a model from the hub, one node downloads it and the others copy it
over the LAN. Waiting for the whole model on the first node serializes the two transfers;
following overlaps them. The peer lists what it offers (`GET /v1/models/{id}/files`: the
files its running download has verified so far, or the whole manifest once it holds the
model); this node polls that list and hands each new file to the pipelined copier
(`copier.run_copy`), which checks every byte against the listed sha256 — each file whole,
never by block digests the peer would have listed itself.

The peer stays untrusted (see `peer`): its list is read up to a bounded size and validated,
a file it lists cannot change its size or hash later, and an error never quotes its answer.
The copy ends when the peer's list is complete and every file is verified here; a peer
whose download failed or was cancelled ends it with `source_failed` (partial files kept: a
later copy of the same request resumes them). A peer whose list never completes cannot keep
the copy alive forever: past `deadline_s` (PIPESERVE_FOLLOW_DEADLINE_S) from the copy's first
start — kept with its resume record, so restarts of the job or the agent do not renew it — it
fails with `follow_deadline` and its partial files are removed.
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from orchestrator.agent.copy.copier import Copy, run_copy
from orchestrator.agent.copy.peer import NETWORK_RETRIES, TIMEOUT, Peer, network_reason, status_error
from orchestrator.agent.jobs import DownloadError, Job
from orchestrator.agent.schemas import FileEntry, Manifest, OfferedFiles, PeerSource
from orchestrator.logs import EventLogger

POLL_S = 0.2  # how soon a file the peer has verified is noticed (one small GET each time)
MAX_LISTING = 4 << 20  # bytes of a peer's file list read at most (thousands of files fit)


def new_files(offered: OfferedFiles, known: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """The files of a peer's list not copied yet (pure); DownloadError when the peer stopped or
    changed a file it listed before."""
    if offered.state in ("failed", "cancelled"):
        raise DownloadError(f"the source node's download {offered.state}: nothing more to copy", "source_failed",
                            keep_partial=True)
    changed = sorted(rel for rel, e in offered.manifest.files.items() if rel in known and known[rel] != e)
    if changed:
        raise DownloadError(f"mismatch: the source node changed {', '.join(changed)} after offering it",
                            "mismatch", changed)
    return {rel: e for rel, e in offered.manifest.files.items() if rel not in known}


def fetch_offered(peer: Peer) -> OfferedFiles:
    """The peer's list of verified files (one GET with the ticket); OSError/HTTPException on network trouble."""
    conn = http.client.HTTPConnection(peer.host, peer.port, timeout=TIMEOUT[1])
    try:
        conn.request("GET", peer.base.rstrip("/"), headers={"Authorization": f"Bearer {peer.ticket}"})
        r = conn.getresponse()
        if r.status == 404:  # e.g. an agent restarted and not yet asked to fetch again: the control plane decides
            raise DownloadError("the source node has neither the model nor a download of it", "source_failed",
                                keep_partial=True)
        if r.status != 200:
            raise status_error(r.status, "the list of verified files")
        body = r.read(MAX_LISTING + 1)
    finally:
        conn.close()
    if len(body) > MAX_LISTING:
        raise DownloadError(f"the peer's list of verified files is over {MAX_LISTING} bytes", "peer_error")
    try:
        return OfferedFiles.model_validate_json(body)
    except ValidationError:
        raise DownloadError("the peer's list of verified files is malformed", "peer_error") from None


def follow_peer(job: Job, source: PeerSource, files_dir: Path, log: EventLogger, hashers: int = 2,
                poll_s: float = POLL_S, deadline_s: float = 24 * 3600.0,
                wall: Callable[[], float] = time.time) -> Manifest:
    """Copy every file the peer verifies into `files_dir` until the peer holds the whole model;
    returns the model's manifest (the peer's complete list, every file verified here).
    DownloadError `follow_deadline` once `deadline_s` have passed since the copy first started."""
    peer = Peer.of(source.url, source.ticket, source.model_id or job.model_id)
    c = Copy(job, log, [peer], files_dir, complete=False)
    known: dict[str, FileEntry] = {}
    started = c.attempts.follow_started(wall())  # wall time: it must hold across restarts

    def feed(c: Copy) -> None:
        failures, admitted = 0, 0
        while not c.over:
            if wall() - started > deadline_s:
                raise DownloadError(f"the source node's download did not complete within {deadline_s:g} s of "
                                    "following it (PIPESERVE_FOLLOW_DEADLINE_S): partial files removed",
                                    "follow_deadline")
            try:
                offered = fetch_offered(peer)
                failures = 0
            except (OSError, http.client.HTTPException) as exc:
                failures += 1
                if failures > NETWORK_RETRIES:
                    raise DownloadError(f"peer unreachable for its list of verified files: {network_reason(exc)}",
                                        "peer_unreachable", keep_partial=True) from None
                log.warning("download.retry", file="(list of verified files)", host=f"{peer.host}:{peer.port}",
                            reason=network_reason(exc), attempt=failures)
                job.cancel.wait(0.5 * failures)
                continue
            # Block digests from the peer's own list are dropped: whatever answers at its address
            # would vouch for its own bytes with them. Each file is checked whole against the
            # listed sha256 (which the control plane compares with the hub's) and recorded
            # without blocks, until this node hashes it itself.
            fresh = {rel: e.model_copy(update={"blocks": None}) for rel, e in new_files(offered, known).items()}
            # Admitted for what the peer announces AND what it lists: a list claiming
            # `total_bytes: 0` beside a 10 TiB file once wrote 300 MiB before anything stopped it.
            # Every byte a file brings is then capped by its listed size (the copier).
            needed = max(offered.total_bytes, sum(e.size for e in {**known, **fresh}.values()))
            if needed > admitted:
                job.require_space(needed)
                admitted = needed
            with job.lock:
                job.total_bytes = needed
                job.files_total = offered.files_total
            known.update(fresh)
            c.add(fresh, rehash=True)
            if offered.complete:
                c.all_known()
                return
            job.cancel.wait(poll_s)

    run_copy(c, hashers, feed)
    return Manifest(files=known)
