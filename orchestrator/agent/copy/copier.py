"""A verified LAN copy from one or several peer agents, pipelined and hashed on every core.

Where the time of the old one-thread copy went (receive, write, sha256, fsync, one after
the other): sha256 alone is about a third of it. Here the work is split:

- one receiver thread per peer takes work items — whole files, or byte ranges of a large
  file when several peers hold it, or one block fetched again — and moves them with
  splice (socket -> pipe -> page cache, see `kernel_io`) into `<file>.part`;
- hasher threads (one per core by default) check the bytes while they still arrive,
  re-reading them from the page cache into a small reused buffer (1 MiB, hot in the CPU
  cache; measured about a quarter less CPU than hashing an mmap of the block);
- a file whose manifest entry has blocks (`blocks`: the sha256 of each 16+ MiB block,
  produced on the serving node in the same pass as the whole-file sha256) is checked
  block by block: each block is queued as soon as all its bytes landed and whichever
  hasher is free takes it, so one large file is hashed on all cores at once, and a hasher
  never waits on the network (measured: following each block as it fills instead saves
  nothing here, the receive is the slower side). A block that differs
  is fetched again (its byte range only); a second difference fails the job as a mismatch
  naming the file, the block and the peer that sent it;
- a file without blocks (an older agent's manifest, a small file) is checked whole: one
  hasher follows its contiguous written prefix with sha256 from its first landed byte; a
  file that differs is fetched again once from scratch, then the job fails as a mismatch;
- verified ranges are handed to writeback at once (sync_file_range), so the fsync before
  the rename has little left; a file is fsynced and renamed from `.part` only once every
  block (or its whole sha256) matched the manifest: nothing unverified becomes visible.

Why blocks rather than something cheaper: the whole-file sha256 is one sequential chain,
so checking it costs size / ~1.4 GB/s on one core whatever the network does (0.4 s for a
538 MB shard, the floor of the old design on this 2-core machine); the trust argument for
trading it for block digests is in `blocks`.

Resume: a file taken in ranges records its ranges' progress in `<work>/ranges/<file>.json`
(never more than is on disk); a `.part` without one is a contiguous prefix (as written by
a single receiver, or by earlier versions). Block checks are not recorded: a resumed file's
landed blocks are hashed again (in parallel) before the rest arrives. The peer stays
untrusted (see `peer`). Each copy logs `copy.timing`: where its time went.

Modules: this one runs a copy and its receivers; `shared` holds what they share;
`check` is the hashers.
"""

from __future__ import annotations

import http.client
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from orchestrator.agent.copy.check import hasher
from orchestrator.agent.copy.kernel_io import SPLICE, splice_body
from orchestrator.agent.copy.parts import QUEUED, Part, save_ranges
from orchestrator.agent.copy.peer import (
    NETWORK_RETRIES,
    TIMEOUT,
    Peer,
    network_reason,
    oversize_error,
    peers_of,
    status_error,
)
from orchestrator.agent.copy.shared import Copy
from orchestrator.agent.jobs import Cancelled, DownloadError, Job
from orchestrator.agent.schemas import PeerSource
from orchestrator.logs import EventLogger

RECV_CHUNK = 1 << 20  # measured: 4 MiB blocks fall out of the CPU cache between recv and pwrite (2-3x the CPU)


def copy_from_peers(job: Job, source: PeerSource, files_dir: Path, linked: set[str], log: EventLogger,
                    hashers: int | None = None) -> None:
    """Bring every file of the job's manifest into `files_dir` (those in `linked` are already there)."""
    assert job.manifest is not None
    c = Copy(job, log, peers_of(source, job.model_id), files_dir)
    c.add(job.manifest.files, linked)
    run_copy(c, hashers or default_hashers())


def default_hashers() -> int:
    """One hasher per core this process may use (at least 2: a file checked whole holds one)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(2, min(cores, 8))


def run_copy(c: Copy, hashers: int, feeder: Callable[[Copy], None] | None = None) -> None:
    """Run the receivers and hashers (and `feeder`, which adds files until it calls `all_known`) to the end.

    Raises the first error (a DownloadError, Cancelled, or a bug, reported on the job).
    """
    if c.done:
        return
    receivers = [threading.Thread(target=_receiver, args=(c, peer), daemon=True, name=f"copy-recv-{i}")
                 for i, peer in enumerate(c.peers)]
    hashing = [threading.Thread(target=hasher, args=(c,), daemon=True, name=f"copy-hash-{i}")
               for i in range(hashers)]
    threads = receivers + hashing
    if feeder is not None:
        threads.append(threading.Thread(target=_feed, args=(c, feeder), daemon=True, name="copy-feed"))
    for t in threads:
        t.start()
    with c.cond:
        while not c.over:
            c.cond.wait(0.25)
    c.fail(Cancelled())  # whatever ended it: every thread stops now (no effect when an error came first)
    for _ in receivers:
        c.work.put(None)  # wakes a thread waiting for work now, not at its next poll
    for _ in hashing:
        c.to_hash.put(None)
    if not c.done:
        c.unblock()
    for t in threads:
        t.join()
    for p in c.parts:
        if p.part.exists():
            save_ranges(p)
    if c.done and c.parts:
        c.log.info("copy.timing", model=c.job.model_id, peers=len(c.peers), hashers=hashers,
                   **c.timing.fields(sum(p.size for p in c.parts)))
    if not c.done:
        raise c.error or Cancelled()


def _feed(c: Copy, feeder: Callable[[Copy], None]) -> None:
    try:
        feeder(c)
    except Cancelled:
        c.fail(Cancelled())
    except BaseException as exc:  # noqa: BLE001 (a DownloadError, or a bug: the job reports it)
        c.fail(exc)


class _Stale(Exception):
    """The file was thrown away while one of its ranges was being fetched."""


class _Restart(_Stale):
    """The peer answered a resume with the whole file (200): the file starts over."""


def _receiver(c: Copy, peer: Peer) -> None:
    """Take work items until none is left; a fatal error stops the whole copy."""
    conn: http.client.HTTPConnection | None = None
    cpu = time.thread_time()
    try:
        while not c.over:
            try:
                item = c.work.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                return
            kind, p, i, generation, failures = item
            if generation != p.generation:
                continue  # the file was thrown away since: its new items are queued
            if conn is None:
                conn = http.client.HTTPConnection(peer.host, peer.port, timeout=TIMEOUT[1])
                with c.cond:
                    c.conns.append(conn)
            try:
                if kind == "range":
                    _fetch_range(c, conn, peer, p, i, generation)
                else:
                    _fetch_block(c, conn, peer, p, i, generation)
            except _Restart:
                conn.close()
                conn = None
                # A restart counts against the file's budget like a network failure, and carries the
                # count into the new try: else a peer answering every resume with a short 200 keeps
                # the copy running forever (a restart once reset the count to 0).
                failures += 1
                if failures > NETWORK_RETRIES:
                    c.fail(DownloadError(
                        f"peer {peer.host}:{peer.port} answered {failures} resumes of {p.rel} with the whole "
                        "file (200, not the byte range asked for) and never sent it whole", "peer_error", [p.rel]))
                    return
                c.log.warning("download.restart", file=p.rel, host=f"{peer.host}:{peer.port}", attempt=failures)
                c.restart(p, failures)
            except _Stale:
                conn.close()
                conn = None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = None
                if isinstance(exc, (FileNotFoundError, PermissionError)):
                    raise
                if c.over:
                    return
                failures += 1
                if failures > NETWORK_RETRIES:
                    c.fail(DownloadError(f"peer unreachable for {p.rel}: {network_reason(exc)}", "peer_unreachable",
                                         keep_partial=True))
                    return
                c.log.warning("download.retry", file=p.rel, host=f"{peer.host}:{peer.port}",
                              reason=network_reason(exc), attempt=failures)
                if c.job.cancel.wait(0.5 * failures):
                    return
                c.work.put((kind, p, i, generation, failures))
            finally:
                with c.cond:
                    if p.generation == generation:
                        save_ranges(p)
    except Cancelled:
        c.fail(Cancelled())
    except BaseException as exc:  # noqa: BLE001 (a DownloadError, or a bug: the job reports it)
        c.fail(exc)
    finally:
        if conn is not None:
            conn.close()
        with c.cond:
            c.timing.recv_cpu += time.thread_time() - cpu


def _fetch_range(c: Copy, conn: http.client.HTTPConnection, peer: Peer, p: Part, i: int, generation: int) -> None:
    """One range of one file into its `.part`; never writes outside the range."""
    start, end, written = p.ranges[i]
    offset, whole = start + written, start == 0 and end == p.size and written == 0
    if offset >= end:
        if p.size == 0:
            p.part.touch()
        with c.cond:
            if p.blocks is None:
                c.hash_whole(p)
            c.cond.notify_all()
        return
    who = f"{peer.host}:{peer.port}"

    def landed(n: int) -> None:
        with c.cond:
            at = start + p.ranges[i][2]
            p.ranges[i][2] += n
            p.counted += n
            if p.blocks is not None:
                c.queue_landed(p, at, at + n, who)  # the hashers wait on their queue: nobody to wake
            else:
                c.hash_whole(p)
                c.arrived.notify_all()  # the hasher following this file

    _get(c, conn, peer, p, offset, end, generation, landed, whole=whole, restartable=start == 0 and end == p.size)


def _fetch_block(c: Copy, conn: http.client.HTTPConnection, peer: Peer, p: Part, k: int, generation: int) -> None:
    """One block again (it differed from its digest) over the bytes there; queued for a hasher once whole."""
    bs, be = p.span(k)
    done = [0]  # this try's bytes (an interrupted try's are overwritten by the next)

    def landed(n: int) -> None:
        with c.cond:
            done[0] += n
            p.counted += n
            if done[0] == be - bs:
                p.block_peer[k] = f"{peer.host}:{peer.port}"
                p.state[k] = QUEUED
                c.to_hash.put((p, k, p.generation))

    try:
        _get(c, conn, peer, p, bs, be, generation, landed)
    finally:
        if done[0] < be - bs:  # an interrupted try: the next one counts the block's bytes from zero
            with c.cond:
                p.counted -= done[0]
            c.job.uncount(done[0])


def _get(c: Copy, conn: http.client.HTTPConnection, peer: Peer, p: Part, offset: int, end: int, generation: int,
         on_landed: Callable[[int], None], whole: bool = False, restartable: bool = False) -> None:
    """Bytes [offset, end) of a file from a peer into its `.part` (the whole file when `whole`: no
    Range); `on_landed(n)` after each write. Never writes outside [offset, end). `restartable`: a
    peer that answers a resume of the file's only range with the whole file restarts the file."""
    with c.job.lock:
        c.job.current_file = p.rel
    headers = {"Authorization": f"Bearer {peer.ticket}"}
    if not whole:
        headers["Range"] = f"bytes={offset}-{end - 1}"
    conn.request("GET", peer.base + quote(p.rel), headers=headers)
    r = conn.getresponse()
    expect = end - offset
    if r.status == 206 and (r.getheader("Content-Range") or "").startswith(f"bytes {offset}-"):
        pass
    elif r.status == 200 and whole:
        pass
    elif r.status == 200 and restartable:
        raise _Restart  # the peer ignored the range of a resume: the receiver starts the file over
    else:
        raise status_error(r.status, p.rel)
    declared = r.getheader("Content-Length")
    if declared is not None and (not declared.strip().isdigit() or int(declared) > expect):
        raise oversize_error(p.rel, p.size)  # refused before a byte is read
    fd = os.open(p.part, os.O_WRONLY | os.O_CREAT, 0o644)
    buf = memoryview(bytearray(min(RECV_CHUNK, expect)))

    def landed(n: int) -> None:
        if p.generation != generation:
            raise _Stale
        if c.job.cancel.is_set() or c.error is not None:
            raise Cancelled
        on_landed(n)
        c.job.transferred(n)
        c.timing.last_byte = time.perf_counter()
        if not c.timing.first_byte:
            c.timing.first_byte = c.timing.last_byte

    try:
        got = 0
        if declared is not None and SPLICE and conn.sock is not None:
            # The body goes socket -> pipe -> page cache inside the kernel: no copy through Python.
            got = splice_body(conn, r, fd, offset, expect, landed, RECV_CHUNK, TIMEOUT[1])
        while got < expect:
            # Whole blocks: the C loop fills the buffer with few Python steps per byte. A
            # stalled peer cannot hold a cancel up: the copy shuts the socket down (`unblock`).
            n = r.readinto(buf[:min(len(buf), expect - got)])
            if not n:
                break
            os.pwrite(fd, buf[:n], offset + got)
            landed(n)
            got += n
    finally:
        os.close(fd)
    if got == expect and declared is None and r.read1(1):  # one byte too many is enough to know
        raise oversize_error(p.rel, p.size)
    if got < expect:
        raise http.client.IncompleteRead(b"", expect - got)
    r.close()
