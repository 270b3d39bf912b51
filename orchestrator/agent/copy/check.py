"""The hashers of a LAN copy (`copier`): check each landed block or file against the
manifest, hand verified bytes to writeback, and install a file (fsync, rename from `.part`)
once all of it matched; a difference is fetched again once, then fails the copy naming the
file, the block and the peer.
"""

from __future__ import annotations

import hashlib
import os
import queue
import time

from orchestrator.agent.copy.kernel_io import start_writeback
from orchestrator.agent.copy.parts import GOOD, QUEUED, REFETCH, Part
from orchestrator.agent.copy.shared import Copy
from orchestrator.agent.jobs import Cancelled, DownloadError

HASH_CHUNK = 1 << 20  # read back while still hot in the cache, hashed in place
WRITEBACK_EVERY = 64 << 20  # hashed bytes (of a file checked whole) after which writeback starts


def hasher(c: Copy) -> None:
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
            p.block_tries[k] = c.attempts.count_block_mismatch(p.rel, k)  # persisted: a restart grants no refetch
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
    """The whole file differs from the manifest: throw it away and fetch it again, once in the copy's
    life (every run of it: the count is kept with its resume record, `record`)."""
    c.log.warning("download.corrupt_file", model=c.job.model_id, file=p.rel, attempt=p.attempts + 1)
    if p.attempts >= 1:
        raise DownloadError(f"mismatch: {p.rel} from the peer differs from the manifest (sha256 checked twice)",
                            "mismatch", [p.rel])
    p.attempts = c.attempts.count_refetch(p.rel)  # persisted first: a restart must not reset it
    with c.cond:
        c.timing.refetched += 1
    c.restart(p)
