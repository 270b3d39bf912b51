"""A verified LAN copy from one or several peer agents, pipelined.

Where the time of the old one-thread copy went (receive, write, sha256, fsync, one after
the other): sha256 alone is about a third of it. Here the work is split:

- one receiver thread per peer takes work items — whole files, or byte ranges of a large
  file when several peers hold it — and writes them with `pwrite` into `<file>.part`;
- hasher threads follow each file's contiguous written prefix (re-read from the page cache)
  with sha256 while the bytes still arrive, and ask the kernel to start writing hashed
  ranges back early, so the final fsync has little left to do;
- a file is fsynced and renamed from `.part` only once its sha256 matches the manifest; a
  file that differs is fetched again once from scratch, then the job fails as a mismatch.

Resume: a file taken in ranges records its ranges' progress in `<work>/ranges/<file>.json`
(never more than is on disk); a `.part` without one is a contiguous prefix (as written by
a single receiver, or by earlier versions). The peer stays untrusted (see `peer`).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import queue
import socket
import threading
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from ..logs import EventLogger
from .fastio import SPLICE, splice_body, start_writeback
from .jobs import Cancelled, DownloadError, Job
from .inventory import sha256_file
from .parts import Part, load_part, save_ranges
from .peer import NETWORK_RETRIES, TIMEOUT, Peer, network_reason, oversize_error, peers_of, status_error
from .schemas import FileEntry, PeerSource

RECV_CHUNK = 1 << 20  # measured: 4 MiB blocks fall out of the CPU cache between recv and pwrite (2-3x the CPU)
HASH_CHUNK = 1 << 20  # read back while still hot in the cache, hashed in place
WRITEBACK_EVERY = 64 << 20  # hashed bytes after which the kernel is asked to start writing them back


@dataclass
class Copy:
    """Shared state of one copy: the parts, the work queues, the first fatal error.

    `complete` is False while more files may still come (a copy that follows a peer's own
    download learns its files as the peer verifies them); the copy is over only once every
    file is known and verified.
    """

    job: Job
    log: EventLogger
    peers: list[Peer]
    files_dir: Path
    parts: list[Part] = field(default_factory=list)
    complete: bool = True
    work: queue.Queue = field(default_factory=queue.Queue)
    to_hash: queue.Queue = field(default_factory=queue.Queue)
    cond: threading.Condition = field(default_factory=threading.Condition)
    error: BaseException | None = None
    verified: int = 0
    conns: list[http.client.HTTPConnection] = field(default_factory=list)

    def add(self, files: dict[str, FileEntry], linked: set[str] = frozenset(), rehash: bool = False) -> None:
        """Queue files for the receivers and hashers; a file already in place counts as done at once.

        A file in place was renamed from `.part` only after verification against the same request;
        `rehash` checks it again (a following copy knows its files only from the peer's listing).
        """
        for rel, entry in files.items():
            target = self.files_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() and target.stat().st_size == entry.size:
                if not rehash or sha256_file(target) == entry.sha256:
                    self.job.file_done(entry.size, "reused" if rel in linked else "resumed", counted=0)
                    continue
                target.unlink()
            p = load_part(rel, entry.size, entry.sha256, target, self.files_dir.parent / "ranges" / f"{rel}.json",
                          len(self.peers))
            p.counted = sum(w for _, _, w in p.ranges)
            with self.job.lock:
                self.job.resumed_bytes += p.counted
                self.job.current_bytes += p.counted
            save_ranges(p)
            with self.cond:
                self.parts.append(p)
                for i, (start, end, written) in enumerate(p.ranges):
                    if written < end - start or end == start:
                        self.work.put((p, i, p.generation, 0))
                self.to_hash.put(p)
                self.cond.notify_all()

    def all_known(self) -> None:
        """No more files will be added."""
        with self.cond:
            self.complete = True
            self.cond.notify_all()

    def unblock(self) -> None:
        """Shut every receiver's socket down, so a read waiting on a stalled peer returns now."""
        with self.cond:
            conns = list(self.conns)
        for conn in conns:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def fail(self, exc: BaseException) -> None:
        with self.cond:
            if self.error is None:
                self.error = exc
            self.cond.notify_all()

    @property
    def done(self) -> bool:
        """Every file is known and verified."""
        return self.complete and self.verified == len(self.parts)

    @property
    def over(self) -> bool:
        return self.error is not None or self.done or self.job.cancel.is_set()


def copy_from_peers(job: Job, source: PeerSource, files_dir: Path, linked: set[str], log: EventLogger,
                    hashers: int = 2) -> None:
    """Bring every file of the job's manifest into `files_dir` (those in `linked` are already there)."""
    assert job.manifest is not None
    c = Copy(job, log, peers_of(source, job.model_id), files_dir)
    c.add(job.manifest.files, linked)
    run_copy(c, max(1, min(hashers, len(c.parts))))


def run_copy(c: Copy, hashers: int, feeder: Callable[[Copy], None] | None = None) -> None:
    """Run the receivers and hashers (and `feeder`, which adds files until it calls `all_known`) to the end.

    Raises the first error (a DownloadError, Cancelled, or a bug, reported on the job).
    """
    if c.done:
        return
    threads = [threading.Thread(target=_receiver, args=(c, peer), daemon=True, name=f"copy-recv-{i}")
               for i, peer in enumerate(c.peers)]
    threads += [threading.Thread(target=_hasher, args=(c,), daemon=True, name=f"copy-hash-{i}")
                for i in range(hashers)]
    if feeder is not None:
        threads.append(threading.Thread(target=_feed, args=(c, feeder), daemon=True, name="copy-feed"))
    for t in threads:
        t.start()
    with c.cond:
        while not c.over:
            c.cond.wait(0.25)
    c.fail(Cancelled())  # whatever ended it: every thread stops now (no effect when an error came first)
    if not c.done:
        c.unblock()
    for t in threads:
        t.join()
    for p in c.parts:
        if p.part.exists():
            save_ranges(p)
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


def _restart_file(c: Copy, p: Part) -> None:
    """Throw a part away and queue it again from its first byte (the hashers start over too)."""
    with c.cond:
        p.generation += 1
        p.part.unlink(missing_ok=True)
        c.job.uncount(p.counted)
        p.counted = 0
        for r in p.ranges:
            r[2] = 0
        for i in range(len(p.ranges)):
            c.work.put((p, i, p.generation, 0))
        c.cond.notify_all()


def _receiver(c: Copy, peer: Peer) -> None:
    """Take work items until none is left; a fatal error stops the whole copy."""
    conn: http.client.HTTPConnection | None = None
    try:
        while not c.over:
            try:
                p, i, generation, failures = c.work.get(timeout=0.1)
            except queue.Empty:
                continue
            if generation != p.generation:
                continue  # the file was thrown away since: its new items are queued
            if conn is None:
                conn = http.client.HTTPConnection(peer.host, peer.port, timeout=TIMEOUT[1])
                with c.cond:
                    c.conns.append(conn)
            try:
                _fetch_range(c, conn, peer, p, i, generation)
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
                c.work.put((p, i, generation, failures))
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


def _fetch_range(c: Copy, conn: http.client.HTTPConnection, peer: Peer, p: Part, i: int, generation: int) -> None:
    """One range of one file into its `.part`; never writes outside the range."""
    start, end, written = p.ranges[i]
    offset, whole = start + written, start == 0 and end == p.size and written == 0
    if offset >= end:
        if p.size == 0:
            p.part.touch()
        with c.cond:
            c.cond.notify_all()
        return
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
    elif r.status == 200 and start == 0 and end == p.size:
        _restart_file(c, p)  # the peer ignored the range of a resume: the file starts over
        raise _Stale
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
        with c.cond:
            p.ranges[i][2] += n
            p.counted += n
            c.cond.notify_all()
        c.job.transferred(n)

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


def _hasher(c: Copy) -> None:
    """Verify parts in the order they were added while they arrive; install each verified one."""
    try:
        while not c.over:
            try:
                p = c.to_hash.get(timeout=0.1)
            except queue.Empty:
                if not c.complete:
                    continue  # more files may come
                try:  # every file was queued before `complete` was set: one more look sees them all
                    p = c.to_hash.get_nowait()
                except queue.Empty:
                    return  # the other hashers hold what is left
            _verify(c, p)
    except Cancelled:
        c.fail(Cancelled())
    except BaseException as exc:  # noqa: BLE001
        c.fail(exc)


def _verify(c: Copy, p: Part) -> None:
    buf = memoryview(bytearray(HASH_CHUNK))
    while True:
        digest, pos, generation = hashlib.sha256(), 0, p.generation
        fd: int | None = None
        flushed = 0
        try:
            while pos < p.size:
                with c.cond:
                    # a block's worth at a time (or the file's end): fewer wake-ups, larger sha256 updates
                    while (p.frontier() - pos < min(HASH_CHUNK, p.size - pos) and p.generation == generation
                           and not c.over):
                        c.cond.wait(0.25)
                    if c.over:
                        raise Cancelled
                    if p.generation != generation:
                        break
                    upto = p.frontier()
                if fd is None:
                    fd = os.open(p.part, os.O_RDONLY)
                while pos < upto:
                    # into one reused buffer: a fresh 4 MiB object per read costs page faults and zeroing
                    n = os.preadv(fd, [buf[:min(HASH_CHUNK, upto - pos)]], pos)
                    if not n:
                        raise OSError(f"{p.part} is shorter than its written ranges")
                    digest.update(buf[:n])
                    pos += n
                if pos - flushed >= WRITEBACK_EVERY:
                    # Start writing hashed bytes back now, so the fsync before the rename has
                    # little left to wait for.
                    start_writeback(fd, flushed, pos - flushed)
                    flushed = pos
            else:
                if p.size == 0 and not p.part.exists():
                    p.part.touch()
                if digest.hexdigest() == p.sha256:
                    _install(c, p)
                    return
                _refetch(c, p)
        finally:
            if fd is not None:
                os.close(fd)


def _install(c: Copy, p: Part) -> None:
    """fsync, then rename the verified part into place."""
    with open(p.part, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(p.part, p.target)
    if p.sidecar is not None:
        p.sidecar.unlink(missing_ok=True)
    c.job.file_done(p.size, counted=p.counted)
    with c.cond:
        c.verified += 1
        c.cond.notify_all()


def _refetch(c: Copy, p: Part) -> None:
    """The whole file differs from the manifest: throw it away and fetch it again, once."""
    c.log.warning("download.corrupt_file", model=c.job.model_id, file=p.rel, attempt=p.attempts + 1)
    if p.attempts >= 1:
        raise DownloadError(f"mismatch: {p.rel} from the peer differs from the manifest (sha256 checked twice)",
                            "mismatch", [p.rel])
    p.attempts += 1
    _restart_file(c, p)
