"""A file being assembled from byte ranges, and how far it got (for a resume).

A file taken in ranges (several peers) records its ranges' progress in
`<work>/ranges/<file>.json` — never more than is on disk; a `.part` without one is a
contiguous prefix (as written by a single receiver, or by earlier versions of the copy).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

SPLIT_MIN = 32 << 20  # a file is shared between peers only in ranges of at least this
PENDING, QUEUED, GOOD, REFETCH = range(4)  # a block: not all landed, waiting for a hasher, verified, fetched again


@dataclass
class Part:
    """One file being assembled: its ranges [start, end, written] and its state."""

    rel: str
    size: int
    sha256: str
    target: Path
    ranges: list[list[int]]
    sidecar: Path | None  # set when the file is taken in several ranges
    counted: int = 0  # bytes of it counted as in progress in the job
    generation: int = 0  # bumped when the file is thrown away and fetched again
    attempts: int = 0
    hashing: bool = False  # a hasher follows it (a file checked whole)
    # A file checked block by block (its manifest entry has blocks, see `blocks`):
    bsize: int = 0
    blocks: list[str] | None = None  # the expected sha256 of each block
    state: list[int] = field(default_factory=list)  # per block: PENDING, QUEUED, GOOD or REFETCH
    block_tries: list[int] = field(default_factory=list)  # mismatches seen per block
    block_peer: list[str] = field(default_factory=list)  # who sent each block's bytes last
    left: int = 0  # blocks not verified yet

    def set_blocks(self, bsize: int, digests: list[str]) -> None:
        self.bsize, self.blocks = bsize, list(digests)
        self.reset_blocks()

    def reset_blocks(self) -> None:
        n = len(self.blocks or ())
        self.state, self.block_tries, self.block_peer, self.left = [PENDING] * n, [0] * n, [""] * n, n

    def span(self, k: int) -> tuple[int, int]:
        return k * self.bsize, min((k + 1) * self.bsize, self.size)

    def block_frontier(self, k: int) -> int:
        """How far block k is written without a gap from its first byte (its end once all landed).

        Ranges are in file order and adjoin (`plan_ranges`): a block may span two of them."""
        bs, be = self.span(k)
        pos = bs
        for s, e, w in self.ranges:
            if e <= pos or s > pos:
                continue
            pos = max(pos, min(s + w, e, be))
            if pos < min(e, be) or pos >= be:
                break  # a gap in this range, or the block's end
        return min(pos, be)

    @property
    def part(self) -> Path:
        return self.target.with_name(self.target.name + ".part")

    def frontier(self) -> int:
        """How many bytes from the start are written without a gap."""
        for start, end, written in self.ranges:
            if written < end - start:
                return start + written
        return self.size


def plan_ranges(size: int, prefix: int, peers: int) -> list[list[int]]:
    """[start, end, written] ranges covering a file: the written prefix, then one share per peer (pure)."""
    shares = max(1, min(peers, (size - prefix) // SPLIT_MIN))
    if shares == 1:
        return [[0, size, prefix]]
    bounds = [prefix + (size - prefix) * i // shares for i in range(shares + 1)]
    return [[0, bounds[1], prefix]] + [[bounds[i], bounds[i + 1], 0] for i in range(1, shares)]


def load_part(rel: str, size: int, sha256: str, target: Path, sidecar: Path, peers: int) -> Part:
    """A part as far as it got before (its sidecar's ranges, else its contiguous size)."""
    part = target.with_name(target.name + ".part")
    ranges: list[list[int]] | None = None
    try:
        saved = json.loads(sidecar.read_text())
        if saved.get("size") == size and saved.get("sha256") == sha256:
            ranges = [[int(a), int(b), int(w)] for a, b, w in saved["ranges"]]
    except (OSError, ValueError, KeyError, TypeError):
        ranges = None
    on_disk = part.stat().st_size if part.exists() else 0
    if ranges is not None and len(ranges) > 1 and on_disk <= size:
        pending = [r for r in ranges if r[2] < r[1] - r[0]]
        if pending and (len(pending) == peers or peers == 1):  # the same plan still fits: keep every range
            return Part(rel, size, sha256, target, ranges, sidecar)
    if ranges is None:
        prefix = on_disk if on_disk <= size else 0
    else:  # another number of peers now: keep the contiguous prefix, share the rest anew
        prefix = min(Part(rel, size, sha256, target, ranges, None).frontier(), on_disk)
    if part.exists() and (on_disk > size or prefix == 0):
        part.unlink()  # nothing usable in it
    ranges = plan_ranges(size, prefix, peers)
    return Part(rel, size, sha256, target, ranges, sidecar if len(ranges) > 1 else None)


def save_ranges(part: Part) -> None:
    """Record the ranges' progress (only what has been written: a crash re-fetches the rest)."""
    if part.sidecar is None:
        return
    part.sidecar.parent.mkdir(parents=True, exist_ok=True)
    tmp = part.sidecar.with_suffix(".tmp")
    tmp.write_text(json.dumps({"size": part.size, "sha256": part.sha256, "ranges": part.ranges}))
    os.replace(tmp, part.sidecar)
