"""Per-block sha256 digests of a model file, so a LAN copy verifies one file on several cores.

Why: a file's sha256 is one sequential chain — it cannot be split over threads. hashlib
does ~1.3-1.5 GB/s on one core here, so a copy that checks every byte against the
whole-file sha256 waits at least size / 1.4 GB/s for that one thread (0.4 s for a 538 MB
shard), however fast the bytes arrive; on a 2-core node that is the floor of the copy.
With the digest of each block of the file as well, the receiver hashes blocks as they
land, on every core at once, and a block that differs is fetched again on its own (one
range) instead of the whole file.

What they are: `Blocks(size, sha256=[...])` on a manifest entry (`FileEntry.blocks`), the
sha256 of each `size`-byte block of the file, in order (the last one shorter). Files of
one block or less have none (the whole-file hash is as parallel as they can get). The
block size is the smallest power of two from 16 MiB up that leaves a file at most 64
blocks: enough blocks to keep two hashers busy with a 12 ms tail, and a manifest still
small (a 5 GB shard: 40 blocks of 128 MiB, 2.7 KB of hex) — a fetch request that carries
the manifest stays under the agent's 1 MiB request limit up to hundreds of GB.

Trust — why every verified block means the peer's verified file:

- blocks are only ever produced by `hash_file`, in the same pass as the whole-file sha256,
  from the very same buffer: the block list of a file is exactly the block split of the
  bytes whose sha256 the manifest names. They are recorded where that sha256 is (a model
  scanned into the inventory, a hub file checked against the hub's LFS sha256, the demo
  import), never computed later on their own from bytes that may have rotted since; an
  older cache entry without blocks keeps none until the node re-hashes the file (both again);
- they travel inside the manifest the control plane hands to the receiver — the reference
  it already trusts for the whole-file sha256 — never from the serving peer's answer, so a
  peer (or whatever answers at its address) cannot bring its own blocks for its own bytes;
  a copy that follows a peer's running download (`follow`) knows its files only from that
  peer's listing, so it drops the listed blocks and checks each file whole against the
  listed sha256, which the control plane then compares with the hub's;
- the receiver makes a file visible (fsync, rename from `.part`) only once every block
  matched; the bytes are then those the blocks were computed from, so it records the
  same entry, blocks included, and may serve the file onward with them;
- a manifest without blocks (an older agent, a cache entry not re-hashed) is copied and
  checked as before: the whole-file sha256, one thread per file.

Blocks never change what a file *is*: two entries with the same size and sha256 are equal
whatever their blocks (`FileEntry.__eq__`), so checks, resumes and the control plane's
comparisons see the same manifests as before.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

MIN_BLOCK = 16 << 20
MAX_BLOCKS = 64
READ_CHUNK = 2 << 20  # one read feeds both digests (a divisor of every block size)


def block_size(size: int) -> int | None:
    """The block size for a file of `size` bytes; None when it fits one block (pure)."""
    if size <= MIN_BLOCK:
        return None
    b = MIN_BLOCK
    while -(-size // b) > MAX_BLOCKS:
        b *= 2
    return b


def spans(size: int, bsize: int) -> list[tuple[int, int]]:
    """[start, end) of each block (pure)."""
    return [(s, min(s + bsize, size)) for s in range(0, size, bsize)]


class _Helper:
    """One helper thread that runs `whole.update(view)` while the caller hashes the same view.

    hashlib releases the GIL for buffers this large, so the two digests run on two cores.
    """

    def __init__(self) -> None:
        self._go = threading.Semaphore(0)
        self._done = threading.Semaphore(0)
        self._job: tuple[object, memoryview] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="hash-helper")
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            if self._job is None:
                return
            digest, view = self._job
            try:
                digest.update(view)  # type: ignore[attr-defined]
            except BaseException as exc:  # noqa: BLE001 (handed to the caller)
                self._error = exc
            self._done.release()

    def start(self, digest: object, view: memoryview) -> None:
        self._job = (digest, view)
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        self._job = None
        self._go.release()
        self._thread.join()


def hash_file(path: Path) -> tuple[str, dict | None]:
    """(hex sha256 of the whole file, its blocks as {"size", "sha256"} or None) in one read pass.

    Each chunk is read once into one buffer, then hashed into the whole-file digest (on a
    helper thread) and into its block's digest (here) at the same time: the blocks are
    derived from exactly the bytes the whole-file sha256 covers.
    """
    size = path.stat().st_size
    bsize = block_size(size)
    whole = hashlib.sha256()
    if bsize is None:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(READ_CHUNK), b""):
                whole.update(chunk)
        return whole.hexdigest(), None
    buf = memoryview(bytearray(READ_CHUNK))
    digests: list[str] = []
    block, in_block, total = hashlib.sha256(), 0, 0
    helper = _Helper()
    try:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)  # type: ignore[attr-defined]
                if not n:
                    break
                view, total = buf[:n], total + n
                helper.start(whole, view)
                pos = 0
                while pos < n:  # a chunk never spans two blocks (READ_CHUNK divides bsize), but be exact
                    take = min(n - pos, bsize - in_block)
                    block.update(view[pos:pos + take])
                    pos, in_block = pos + take, in_block + take
                    if in_block == bsize:
                        digests.append(block.hexdigest())
                        block, in_block = hashlib.sha256(), 0
                helper.wait()
    finally:
        helper.close()
    if in_block:
        digests.append(block.hexdigest())
    if total != size or len(digests) < 2:  # changed while read: no blocks (its next scan hashes it again)
        return whole.hexdigest(), None
    return whole.hexdigest(), {"size": bsize, "sha256": digests}
