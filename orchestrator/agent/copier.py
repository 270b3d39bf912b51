"""A verified LAN copy from one or several peer agents, pipelined and hashed on every core.

Where the time of the old one-thread copy went (receive, write, sha256, fsync, one after
the other): sha256 alone is about a third of it. Here the work is split:

- one receiver thread per peer takes work items — whole files, or byte ranges of a large
  file when several peers hold it, or one block fetched again — and moves them with
  splice (socket -> pipe -> page cache, see `fastio`) into `<file>.part`;
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
"""

from __future__ import annotations

import hashlib
import http.client
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from ..logs import EventLogger
from .fastio import SPLICE, splice_body, start_writeback
from .jobs import Cancelled, DownloadError, Job
from .inventory import sha256_file
from .parts import GOOD, PENDING, QUEUED, REFETCH, Part, load_part, save_ranges
from .peer import NETWORK_RETRIES, TIMEOUT, Peer, network_reason, oversize_error, peers_of, status_error
from .schemas import FileEntry, PeerSource

RECV_CHUNK = 1 << 20  # measured: 4 MiB blocks fall out of the CPU cache between recv and pwrite (2-3x the CPU)
HASH_CHUNK = 1 << 20  # read back while still hot in the cache, hashed in place
WRITEBACK_EVERY = 64 << 20  # hashed bytes (of a file checked whole) after which writeback starts


@dataclass
class Timing:
    """Where a copy's time went (seconds from its start, or summed over threads)."""

    start: float = field(default_factory=time.perf_counter)
    first_byte: float = 0.0  # when the first byte landed
    last_byte: float = 0.0  # when the last byte landed
    last_verified: float = 0.0  # when the last block or file matched
    hash_s: float = 0.0  # hashers busy reading back and hashing, all threads together
    fsync_s: float = 0.0
    rename_s: float = 0.0
    blocks: int = 0  # blocks checked (0: every file checked whole)
    refetched: int = 0  # blocks or files fetched again
    recv_cpu: float = 0.0  # CPU seconds of the receiver threads (user + system), all together
    hash_cpu: float = 0.0  # CPU seconds of the hasher threads (reading back, sha256, installs)

    def fields(self, total: int) -> dict[str, object]:
        end = time.perf_counter()
        at = lambda t: round(max(0.0, t - self.start), 3) if t else None  # noqa: E731
        return {"bytes": total, "seconds": round(end - self.start, 3), "first_byte_s": at(self.first_byte),
                "last_byte_s": at(self.last_byte),
                "last_verified_s": at(self.last_verified), "hash_s": round(self.hash_s, 3),
                "fsync_s": round(self.fsync_s, 3), "rename_s": round(self.rename_s, 3), "blocks": self.blocks,
                "refetched": self.refetched, "recv_cpu_s": round(self.recv_cpu, 3),
                "hash_cpu_s": round(self.hash_cpu, 3)}


@dataclass
class Copy:
    """Shared state of one copy: the parts, the work queues, the first fatal error.

    `complete` is False while more files may still come (a copy that follows a peer's own
    download learns its files as the peer verifies them); the copy is over only once every
    file is known and verified.

    Work items (`work`, for the receivers): ("range", part, range index, generation, failures)
    or ("block", part, block index, generation, failures). Hash items (`to_hash`): (part, None,
    generation) for a file checked whole, (part, block index, generation) for one block.
    None in either queue stops the thread that takes it.
    """

    job: Job
    log: EventLogger
    peers: list[Peer]
    files_dir: Path
    parts: list[Part] = field(default_factory=list)
    complete: bool = True
    work: queue.Queue = field(default_factory=queue.Queue)
    to_hash: queue.Queue = field(default_factory=queue.Queue)
    lock: threading.RLock = field(default_factory=threading.RLock)
    error: BaseException | None = None
    verified: int = 0
    conns: list[http.client.HTTPConnection] = field(default_factory=list)
    timing: Timing = field(default_factory=Timing)

    def __post_init__(self) -> None:
        # One lock, two wake-ups: `cond` for the copy's progress (a file verified, an error),
        # `arrived` for a hasher following a file checked whole (a notify per MiB received).
        self.cond = threading.Condition(self.lock)
        self.arrived = threading.Condition(self.lock)

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
            if entry.blocks is not None:
                p.set_blocks(entry.blocks.size, entry.blocks.sha256)
            p.counted = sum(w for _, _, w in p.ranges)
            with self.job.lock:
                self.job.resumed_bytes += p.counted
                self.job.current_bytes += p.counted
            save_ranges(p)
            with self.cond:
                self.parts.append(p)
                for i, (start, end, written) in enumerate(p.ranges):
                    if written < end - start or end == start:
                        self.work.put(("range", p, i, p.generation, 0))
                if p.blocks is not None:
                    self.queue_landed(p, 0, p.size)  # a resumed part: what landed before is checked again
                elif p.counted or p.size == 0:
                    self.hash_whole(p)
                self.cond.notify_all()

    def hash_whole(self, p: Part) -> None:
        """Hand a file checked whole to a hasher once its first bytes are there (a hasher
        following a file whose bytes are still far behind would sit idle). Under `cond`."""
        if not p.hashing:
            p.hashing = True
            self.to_hash.put((p, None, p.generation))

    def queue_landed(self, p: Part, lo: int, hi: int, peer: str = "") -> None:
        """Queue the blocks over [lo, hi) whose every byte has now landed. Under `cond`."""
        if hi <= lo:
            return
        for k in range(lo // p.bsize, (hi - 1) // p.bsize + 1):
            if peer:
                p.block_peer[k] = peer
            if p.state[k] == PENDING and p.block_frontier(k) == p.span(k)[1]:
                p.state[k] = QUEUED
                self.to_hash.put((p, k, p.generation))

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
            self.arrived.notify_all()

    @property
    def done(self) -> bool:
        """Every file is known and verified."""
        return self.complete and self.verified == len(self.parts)

    @property
    def over(self) -> bool:
        return self.error is not None or self.done or self.job.cancel.is_set()


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
    hashing = [threading.Thread(target=_hasher, args=(c,), daemon=True, name=f"copy-hash-{i}")
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


def _restart_file(c: Copy, p: Part) -> None:
    """Throw a part away and queue it again from its first byte (the hashers start over too)."""
    with c.cond:
        p.generation += 1
        p.part.unlink(missing_ok=True)
        c.job.uncount(p.counted)
        p.counted = 0
        for r in p.ranges:
            r[2] = 0
        if p.blocks is not None:
            p.reset_blocks()
        for i in range(len(p.ranges)):
            c.work.put(("range", p, i, p.generation, 0))
        c.cond.notify_all()
        c.arrived.notify_all()


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


def _hasher(c: Copy) -> None:
    """Check files and blocks as they land; install each file once all of it matched."""
    buf = memoryview(bytearray(HASH_CHUNK))  # one per thread, reused: hot in this core's cache
    cpu = time.thread_time()
    try:
        while not c.over:
            try:
                item = c.to_hash.get(timeout=0.1)
            except queue.Empty:
                continue
            if item is None:
                return
            p, k, generation = item
            if k is not None and generation != p.generation:
                continue  # thrown away since: its blocks are queued again as they land
            if k is None:
                _verify(c, p, buf)
            else:
                _verify_block(c, p, k, generation, buf)
    except Cancelled:
        c.fail(Cancelled())
    except BaseException as exc:  # noqa: BLE001
        c.fail(exc)
    finally:
        with c.cond:
            c.timing.hash_cpu += time.thread_time() - cpu


def _verify_block(c: Copy, p: Part, k: int, generation: int, buf: memoryview) -> None:
    """sha256 of one landed block against its digest: good (the file is installed after its last
    block), or fetched again once; a second difference fails the copy naming file, block and peer."""
    bs, be = p.span(k)
    t0 = time.perf_counter()
    digest = hashlib.sha256()
    try:
        fd = os.open(p.part, os.O_RDONLY)
    except FileNotFoundError:
        if p.generation != generation:
            return  # thrown away meanwhile (a peer that ignored a resume's range): it lands again
        raise
    try:
        pos = bs
        while pos < be:
            n = os.preadv(fd, [buf[:min(len(buf), be - pos)]], pos)
            if not n:
                raise OSError(f"{p.part} is shorter than its written ranges")
            digest.update(buf[:n])
            pos += n
        ok = digest.hexdigest() == p.blocks[k]  # type: ignore[index]
        if ok:
            start_writeback(fd, bs, be - bs)  # verified: on its way to the disk while the rest comes
    finally:
        os.close(fd)
    now = time.perf_counter()
    with c.cond:
        c.timing.hash_s += now - t0
        if p.generation != generation or p.state[k] != QUEUED:
            return
        if ok:
            p.state[k] = GOOD
            p.left -= 1
            c.timing.blocks += 1
            c.timing.last_verified = now
            last = p.left == 0
        else:
            p.block_tries[k] += 1
            peer = p.block_peer[k] or "the peer"
            c.log.warning("download.corrupt_block", model=c.job.model_id, file=p.rel, block=k, host=peer,
                          attempt=p.block_tries[k])
            if p.block_tries[k] > 1:
                raise DownloadError(f"mismatch: {p.rel} from {peer} differs from the manifest in block {k} "
                                    f"(bytes {bs}-{be - 1}; checked twice)", "mismatch", [p.rel])
            p.state[k] = REFETCH
            p.counted -= be - bs
            c.timing.refetched += 1
            c.work.put(("block", p, k, generation, 0))
            last = False
    if not ok:
        c.job.uncount(be - bs)
    elif last:
        _install(c, p)


def _verify(c: Copy, p: Part, buf: memoryview) -> None:
    """Follow a file checked whole with sha256 as its contiguous prefix grows; install it or fetch it again."""
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
                        c.arrived.wait(0.25)
                    if c.over:
                        raise Cancelled
                    if p.generation != generation:
                        break
                    upto = p.frontier()
                if fd is None:
                    fd = os.open(p.part, os.O_RDONLY)
                t0 = time.perf_counter()
                while pos < upto:
                    # into one reused buffer: a fresh 4 MiB object per read costs page faults and zeroing
                    n = os.preadv(fd, [buf[:min(HASH_CHUNK, upto - pos)]], pos)
                    if not n:
                        raise OSError(f"{p.part} is shorter than its written ranges")
                    digest.update(buf[:n])
                    pos += n
                with c.cond:
                    c.timing.hash_s += time.perf_counter() - t0
                if pos - flushed >= WRITEBACK_EVERY:
                    # Start writing hashed bytes back now, so the fsync before the rename has
                    # little left to wait for.
                    start_writeback(fd, flushed, pos - flushed)
                    flushed = pos
            else:
                if p.size == 0 and not p.part.exists():
                    p.part.touch()
                if digest.hexdigest() == p.sha256:
                    c.timing.last_verified = time.perf_counter()
                    _install(c, p)
                    return
                _refetch(c, p)
        finally:
            if fd is not None:
                os.close(fd)


def _install(c: Copy, p: Part) -> None:
    """fsync, then rename the verified part into place."""
    t0 = time.perf_counter()
    with open(p.part, "rb+") as f:
        os.fsync(f.fileno())
    t1 = time.perf_counter()
    os.replace(p.part, p.target)
    if p.sidecar is not None:
        p.sidecar.unlink(missing_ok=True)
    t2 = time.perf_counter()
    c.job.file_done(p.size, counted=p.counted)
    with c.cond:
        c.timing.fsync_s += t1 - t0
        c.timing.rename_s += t2 - t1
        c.verified += 1
        c.cond.notify_all()


def _refetch(c: Copy, p: Part) -> None:
    """The whole file differs from the manifest: throw it away and fetch it again, once."""
    c.log.warning("download.corrupt_file", model=c.job.model_id, file=p.rel, attempt=p.attempts + 1)
    if p.attempts >= 1:
        raise DownloadError(f"mismatch: {p.rel} from the peer differs from the manifest (sha256 checked twice)",
                            "mismatch", [p.rel])
    p.attempts += 1
    with c.cond:
        c.timing.refetched += 1
    _restart_file(c, p)
