"""The pipelined copy from several peers (orchestrator/agent/copy/copier.py), in process.

Peers here are small range-serving HTTP servers that count what they sent, so a test can
tell which peer served which bytes; the split size is lowered so the ~19 MB test model is
taken in byte ranges. Real agents copying from real agents: test_transfer.py and
tests/control/test_models.py.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from orchestrator.agent.copy import copier, parts
from orchestrator.agent.jobs import Cancelled, DownloadError, Job
from orchestrator.agent.schemas import FileEntry, Manifest, PeerSource
from orchestrator.logs import get as get_log
from orchestrator.proc import wait_until
from tests.support.files import sha256sums
from tests.support.stub_http import StubHandler, StubServer

MODEL = "tm"
MIB = 1 << 20
SHARD = "model-00001-of-00002.safetensors"  # ~10 MB: ten 1 MiB blocks


class RangePeer(StubServer):
    """Serves a model directory's files with `Range: bytes=S-E`; counts bytes; can corrupt once (a
    file, or "*": whatever it serves first) or hold every stream once a byte budget is spent."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir, self.sent, self.corrupt_once = model_dir, 0, set()
        self.corrupt_at: dict[str, int] = {}  # file -> offset flipped in every answer that covers it
        self.requests: list[tuple[str, str]] = []  # (file, Range header or "")
        self.budget: int | None = None  # bytes it may still send; spent: every stream holds
        self.lock = threading.Lock()
        super().__init__(_Handler)
        self.start()

    def spend(self, n: int) -> bool:
        """Whether a chunk of n bytes may go now (the budget is not spent)."""
        with self.lock:
            if self.budget is None:
                return True
            if self.budget <= 0:
                return False
            self.budget -= n
            return True


class _Handler(StubHandler):
    server: RangePeer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        rel = self.path.split("/files/", 1)[1]
        data = (self.server.model_dir / rel).read_bytes()
        start, end, status = 0, len(data) - 1, 200
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            start, end, status = int(m.group(1)), int(m.group(2) or len(data) - 1), 206
        body = bytearray(data[start:end + 1])
        with self.server.lock:
            self.server.requests.append((rel, self.headers.get("Range", "")))
            at = self.server.corrupt_at.get(rel)
            if at is not None and start <= at <= end:
                body[at - start] ^= 0xFF
            which = rel if rel in self.server.corrupt_once else "*" if "*" in self.server.corrupt_once else None
            if which and body:  # "*": the first file (or range) it serves, whichever that is
                self.server.corrupt_once.discard(which)
                body[len(body) // 2] ^= 0xFF
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        for i in range(0, len(body), 1 << 20):
            while not self.server.spend(min(1 << 20, len(body) - i)):
                time.sleep(0.01)
            try:
                self.wfile.write(body[i:i + (1 << 20)])
            except (BrokenPipeError, ConnectionResetError):
                return  # the copier stopped reading (a cancelled or re-planned copy): not the peer's error
            with self.server.lock:
                self.server.sent += min(1 << 20, len(body) - i)


@pytest.fixture
def peers(transfer_model: Path):
    servers = [RangePeer(transfer_model), RangePeer(transfer_model)]
    yield servers
    for s in servers:
        s.budget = None
        s.close()


def manifest_of(model_dir: Path) -> Manifest:
    return Manifest(files={p.relative_to(model_dir).as_posix(): FileEntry(size=p.stat().st_size,
                                                                          sha256=hashlib.sha256(p.read_bytes()).hexdigest())
                           for p in sorted(model_dir.rglob("*")) if p.is_file()})


def with_blocks(manifest: Manifest, model_dir: Path, bsize: int = MIB) -> Manifest:
    """The manifest with per-block digests (hashlib here, not the code under test) for files over one block."""
    files = {}
    for rel, e in manifest.files.items():
        data = (model_dir / rel).read_bytes()
        blocks = None
        if e.size > bsize:
            blocks = {"size": bsize, "sha256": [hashlib.sha256(data[i:i + bsize]).hexdigest()
                                                for i in range(0, len(data), bsize)]}
        files[rel] = FileEntry(size=e.size, sha256=e.sha256, blocks=blocks)
    return Manifest(files=files)


def source(peers: list[RangePeer]) -> PeerSource:
    return PeerSource(kind="peer", url=peers[0].url, ticket="t" * 20,
                      mirrors=[{"url": p.url, "ticket": "t" * 20} for p in peers[1:]])


def run_copy(job: Job, src: PeerSource, files_dir: Path) -> threading.Thread:
    errors: list[BaseException] = []

    def go() -> None:
        try:
            copier.copy_from_peers(job, src, files_dir, set(), get_log("test-copier"))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


def cancel_midway(peers: list[RangePeer], manifest: Manifest, files: Path) -> Job:
    """Start a copy, let a few MiB through (then every peer's stream holds: the peers count, not
    a race), cancel it once 6 MB arrived; the cancelled job."""
    job = Job(MODEL, "peer", "k", manifest)
    for p in peers:
        p.budget = 3_000_000
    t = run_copy(job, source(peers), files)
    wait_until(lambda: job.info().transferred_bytes >= 6_000_000, 30, message="6 MB received")
    job.cancel.set()
    t.join(30)
    assert t.errors and isinstance(t.errors[0], Cancelled)
    return job


def resume_copy(peers: list[RangePeer], manifest: Manifest, files: Path, model: Path):
    """Let the peers send again and run the copy anew to the end (it resumes what is on disk);
    every file must then equal the model's. Its job's info."""
    for p in peers:
        p.budget = None
    again = Job(MODEL, "peer", "k", manifest)
    t = run_copy(again, source(peers), files)
    t.join(60)
    assert not t.errors, t.errors
    assert sha256sums(files) == sha256sums(model)
    return again.info()


def test_plan_ranges_shares_the_rest_after_the_written_prefix(monkeypatch):
    monkeypatch.setattr(parts, "SPLIT_MIN", 10)
    assert parts.plan_ranges(100, 0, 1) == [[0, 100, 0]]
    assert parts.plan_ranges(100, 0, 2) == [[0, 50, 0], [50, 100, 0]]
    assert parts.plan_ranges(100, 40, 3) == [[0, 60, 40], [60, 80, 0], [80, 100, 0]]
    assert parts.plan_ranges(100, 95, 3) == [[0, 100, 95]]  # too little left to share


def test_two_peers_serve_ranges_of_each_file_and_every_byte_is_verified(monkeypatch, peers, transfer_model,
                                                                       tmp_path):
    monkeypatch.setattr(parts, "SPLIT_MIN", 1 << 20)
    # one range arrives damaged, once: the first that peer 1 serves (which file peer 1 takes
    # ranges of depends on the scheduling, so a fixed file might never pass through it)
    peers[1].corrupt_once.add("*")
    manifest = manifest_of(transfer_model)
    job = Job(MODEL, "peer", "k", manifest)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    t = run_copy(job, source(peers), files)
    t.join(60)
    assert not t.errors, t.errors
    assert sha256sums(files) == sha256sums(transfer_model)
    assert all(p.sent > 2_000_000 for p in peers), [p.sent for p in peers]  # both served a share
    info = job.info()
    assert info.done_bytes == info.total_bytes == manifest.total_bytes
    # the damaged file was taken again from scratch: more than the model crossed the network
    assert info.transferred_bytes > manifest.total_bytes
    assert not list(files.rglob("*.part")) and not (tmp_path / "work" / "ranges").exists() or \
        not list((tmp_path / "work" / "ranges").rglob("*.json"))


def test_a_cancelled_ranged_copy_resumes_every_range(monkeypatch, peers, transfer_model, tmp_path):
    monkeypatch.setattr(parts, "SPLIT_MIN", 1 << 20)
    manifest = manifest_of(transfer_model)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    job = cancel_midway(peers, manifest, files)
    sidecars = list((tmp_path / "work" / "ranges").rglob("*.json"))
    assert sidecars  # ranges recorded with what each had written
    before = job.info().transferred_bytes

    info = resume_copy(peers, manifest, files, transfer_model)
    assert info.resumed_bytes > 0 and info.transferred_bytes <= manifest.total_bytes - info.resumed_bytes + (1 << 20)
    # What was in flight when the copy was cancelled (received, not yet hashed and recorded:
    # the hashing threads lag on a loaded machine) is fetched again; the rest is not.
    assert before + info.transferred_bytes < manifest.total_bytes + (8 << 20)


def test_a_peer_that_keeps_sending_damaged_bytes_fails_the_copy_as_a_mismatch(peers, transfer_model, tmp_path):
    victim = "config.json"
    peers[0].corrupt_once.add(victim)
    shutil.copytree(transfer_model, tmp_path / "bad")
    (tmp_path / "bad" / victim).write_bytes(b"{}" + b" " * ((transfer_model / victim).stat().st_size - 2))
    bad = RangePeer(tmp_path / "bad")  # the only peer: what it sends never matches
    try:
        job = Job(MODEL, "peer", "k", manifest_of(transfer_model))
        files = tmp_path / "work" / "files"
        files.mkdir(parents=True)
        t = run_copy(job, source([bad]), files)
        t.join(60)
        err = t.errors[0]
        assert isinstance(err, DownloadError) and err.code == "mismatch" and err.files == [victim]
    finally:
        bad.close()


def test_real_agents_copy_from_two_peers_at_once(spawn_agent, transfer_model):
    """b takes the model from a and c together (whole files here: both shards are under the
    split size); a mismatching copy on c would fail the job, so the bytes are what a holds."""
    from tests.agent.conftest import copy_model

    a, b, c = spawn_agent("a"), spawn_agent("b"), spawn_agent("c")
    for holder in (a, c):
        copy_model(transfer_model, holder.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    started = b.client.fetch_from_peers(MODEL, [a.client, c.client], manifest)
    assert started.source.startswith("peer:")
    done = b.client.wait_download(MODEL, timeout=60)
    assert done.state == "done" and done.transferred_bytes == manifest.total_bytes, done
    assert sha256sums(b.models_dir / MODEL) == sha256sums(transfer_model)
    assert not (b.models_dir / ".partial" / MODEL).exists()


def test_a_damaged_block_is_detected_and_fetched_again_alone(peers, transfer_model, tmp_path):
    manifest = with_blocks(manifest_of(transfer_model), transfer_model)
    size = manifest.files[SHARD].size
    peers[0].corrupt_at[SHARD] = size // 2  # in the first answer only (below): block 4
    job = Job(MODEL, "peer", "k", manifest)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    real = peers[0].corrupt_at
    peers[0].corrupt_at = _Once(real)
    t = run_copy(job, source(peers[:1]), files)
    t.join(60)
    assert not t.errors, t.errors
    assert sha256sums(files) == sha256sums(transfer_model)
    k = (size // 2) // MIB
    again = [r for rel, r in peers[0].requests if rel == SHARD and r]
    assert again == [f"bytes={k * MIB}-{(k + 1) * MIB - 1}"]  # that block's range, nothing else
    assert job.info().transferred_bytes == manifest.total_bytes + MIB


class _Once(dict):
    """corrupt_at entries that flip their byte in one answer, then are gone."""

    def get(self, key, default=None):
        return self.pop(key, default)


def test_a_block_damaged_again_fails_the_copy_naming_file_block_and_peer(peers, transfer_model, tmp_path):
    manifest = with_blocks(manifest_of(transfer_model), transfer_model)
    offset = 3 * MIB + 5
    peers[0].corrupt_at[SHARD] = offset  # in every answer
    job = Job(MODEL, "peer", "k", manifest)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    t = run_copy(job, source(peers[:1]), files)
    t.join(60)
    err = t.errors[0]
    assert isinstance(err, DownloadError) and err.code == "mismatch" and err.files == [SHARD], err
    assert "block 3" in str(err) and f"127.0.0.1:{peers[0].server_address[1]}" in str(err), err
    assert not (files / SHARD).exists()  # never visible


def test_a_block_that_mismatched_in_an_earlier_run_gets_no_refetch_in_the_next(peers, transfer_model, tmp_path):
    """Issue 20 item 8, per block: the mismatch count of a block lives in the copy's record
    (`attempts.json`, as a crashed run leaves it), so a restart does not grant the block another
    refetch: one damaged answer now fails the copy (a fresh copy fetches the block again instead,
    test_a_damaged_block_is_detected_and_fetched_again_alone)."""
    manifest = with_blocks(manifest_of(transfer_model), transfer_model)
    size = manifest.files[SHARD].size
    k = (size // 2) // MIB
    work = tmp_path / "work"
    (work / "files").mkdir(parents=True)
    (work / "attempts.json").write_text(json.dumps({"block_mismatches": {SHARD: {str(k): 1}}}))
    peers[0].corrupt_at = _Once({SHARD: size // 2})
    t = run_copy(Job(MODEL, "peer", "k", manifest), source(peers[:1]), work / "files")
    t.join(60)
    err = t.errors[0] if t.errors else None
    assert isinstance(err, DownloadError) and err.code == "mismatch" and f"block {k}" in str(err), err


def test_a_manifest_without_blocks_is_checked_whole(peers, transfer_model, tmp_path):
    manifest = manifest_of(transfer_model)
    assert all(e.blocks is None for e in manifest.files.values())
    peers[0].corrupt_once.add(SHARD)
    job = Job(MODEL, "peer", "k", manifest)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    t = run_copy(job, source(peers[:1]), files)
    t.join(60)
    assert not t.errors, t.errors
    assert sha256sums(files) == sha256sums(transfer_model)
    # the damaged file was fetched again from scratch, whole: no block to narrow it down
    assert job.info().transferred_bytes == manifest.total_bytes + manifest.files[SHARD].size
    assert [r for rel, r in peers[0].requests if rel == SHARD] == ["", ""]


def test_a_resumed_block_copy_checks_what_landed_before_and_fetches_only_the_rest(monkeypatch, peers,
                                                                                 transfer_model, tmp_path):
    monkeypatch.setattr(parts, "SPLIT_MIN", 1 << 20)
    manifest = with_blocks(manifest_of(transfer_model), transfer_model)
    files = tmp_path / "work" / "files"
    files.mkdir(parents=True)
    cancel_midway(peers, manifest, files)
    # While the copy is paused, one landed byte of a ranged file rots on disk: the resumed
    # copy must not trust what it wrote before.
    sidecar, (start, _, written) = next((sc, r) for sc in (tmp_path / "work" / "ranges").rglob("*.json")
                                        for r in json.loads(sc.read_text())["ranges"] if r[2] > 0)
    rel = sidecar.relative_to(tmp_path / "work" / "ranges").as_posix()[:-len(".json")]
    flip = start + written // 2
    with open(files / f"{rel}.part", "r+b") as f:
        f.seek(flip)
        b = f.read(1)
        f.seek(flip)
        f.write(bytes([b[0] ^ 0xFF]))

    info = resume_copy(peers, manifest, files, transfer_model)
    assert info.resumed_bytes > 0
    k = flip // MIB
    block = min(MIB, manifest.files[rel].size - k * MIB)
    # the rest of the model, plus the one rotted block fetched again by its range
    assert info.transferred_bytes == manifest.total_bytes - info.resumed_bytes + block
    assert any(r == f"bytes={k * MIB}-{k * MIB + block - 1}" for p in peers for f, r in p.requests if f == rel)
