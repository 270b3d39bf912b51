"""The shared state of one LAN copy (`copier`): its parts, work queues, first error and timing.

Receivers (`copier`) and hashers (`check`) meet here, under one lock with two
wake-ups; see `copier` for how the work is split between them.
"""

from __future__ import annotations

import http.client
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.agent.copy.parts import PENDING, QUEUED, Part, load_part, save_ranges
from orchestrator.agent.copy.peer import Peer
from orchestrator.agent.copy.record import Attempts
from orchestrator.agent.inventory import sha256_file
from orchestrator.agent.jobs import Job
from orchestrator.agent.schemas import FileEntry
from orchestrator.logs import EventLogger


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
        self.attempts = Attempts(self.files_dir.parent / "attempts.json")  # beside the resume record

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
            p.attempts = self.attempts.refetched(rel)  # a restart grants no new refetch
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

    def restart(self, p: Part, failures: int = 0) -> None:
        """Throw a part away and queue it again from its first byte (the hashers start over too);
        its new work items carry `failures`, the file's budget spent so far."""
        with self.cond:
            p.generation += 1
            p.part.unlink(missing_ok=True)
            self.job.uncount(p.counted)
            p.counted = 0
            for r in p.ranges:
                r[2] = 0
            if p.blocks is not None:
                p.reset_blocks()
            for i in range(len(p.ranges)):
                self.work.put(("range", p, i, p.generation, failures))
            self.cond.notify_all()
            self.arrived.notify_all()
