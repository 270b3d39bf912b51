"""Peer downloads between two real agents: verify, mismatch, resume, corruption, cancel, disk space."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.agent.schemas import FileEntry, Manifest
from orchestrator.proc import wait_until
from tests.agent.conftest import copy_model
from tests.support.files import sha256sums

MODEL = "tm"
# Upload limit of the serving agent in tests that act in the middle of a copy: at 4 MB/s the
# ~19 MB model takes ~4.8 s, which leaves a loaded 2-core machine seconds, not tenths, to act.
SLOW = "4M"


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_b_fetches_from_a_and_verifies(spawn_agent, transfer_model):
    a, b = spawn_agent("a"), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    assert {p: e.sha256 for p, e in manifest.files.items()} == sha256sums(transfer_model)
    assert b.client.check(MODEL, manifest).status == "needs_download"

    started = b.client.fetch_from_peer(MODEL, a.client, manifest)
    again = b.client.fetch_from_peer(MODEL, a.client, manifest)  # a retry joins the job (or finds it done)
    assert again.model_id == MODEL and again.source == started.source
    done = b.client.wait_download(MODEL, timeout=60)
    assert done.state == "done", done
    assert done.done_bytes == done.total_bytes == manifest.total_bytes
    assert sha256sums(b.models_dir / MODEL) == sha256sums(transfer_model)
    assert b.client.check(MODEL, manifest, rehash=True).status == "present"
    info = b.client.model(MODEL)
    assert info.mlx_format and info.num_layers == 8 and info.hidden_size == 256
    assert not (b.models_dir / ".partial" / MODEL).exists()  # no work files left behind
    # Fetching a model already present is a no-op that reports done.
    assert b.client.fetch_from_peer(MODEL, a.client, manifest).state == "done"
    assert b.client.progress(MODEL).transferred_bytes == 0


def test_flipped_byte_on_a_is_a_mismatch_naming_the_file(spawn_agent, transfer_model):
    a, b = spawn_agent("a"), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    reference = a.client.model(MODEL).manifest  # the control plane's reference, taken before the damage
    victim = "model-00002-of-00002.safetensors"
    path = a.models_dir / MODEL / victim
    st = path.stat()
    flip_byte(path, st.st_size // 2)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime put back

    result = a.client.check(MODEL, reference)
    assert result.status == "mismatch" and result.mismatched == [victim], result
    assert victim in result.message

    b.client.fetch(MODEL, {"kind": "peer", "url": a.url, "ticket": a.client.ticket(MODEL).ticket}, reference)
    failed = b.client.wait_download(MODEL, timeout=60)
    assert failed.state == "failed" and failed.error_code == "mismatch", failed
    assert failed.mismatched == [victim] and victim in failed.error
    assert not (b.models_dir / MODEL).exists()  # nothing half-done is visible as a model
    assert b.client.check(MODEL, reference).status == "needs_download"


def test_killed_mid_download_resumes_with_range(spawn_agent, transfer_model):
    a, b = spawn_agent("a", "--upload-limit", SLOW), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    total = manifest.total_bytes
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    wait_until(lambda: b.client.progress(MODEL).done_bytes > total * 0.35, 30, message="a third of the download")
    b.stop(signal.SIGKILL)  # a crash: no cleanup at all
    assert not (b.models_dir / MODEL).exists()
    partial = b.models_dir / ".partial" / MODEL / "files"
    on_disk = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
    assert on_disk > total * 0.3

    b.restart()
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    done = b.client.wait_download(MODEL, timeout=60)
    assert done.state == "done", done
    assert done.resumed_bytes >= on_disk * 0.9
    assert done.transferred_bytes <= total - on_disk * 0.9, done  # only the rest crossed the network
    assert sha256sums(b.models_dir / MODEL) == sha256sums(transfer_model)


def test_corrupted_partial_file_is_detected_and_fetched_again(spawn_agent, transfer_model):
    a, b = spawn_agent("a", "--upload-limit", SLOW), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    first = "model-00001-of-00002.safetensors"  # the first large file in manifest order
    part = b.models_dir / ".partial" / MODEL / "files" / f"{first}.part"
    wait_until(lambda: part.exists() and part.stat().st_size > 1_000_000, 30, message="part of the first file")
    b.stop(signal.SIGKILL)
    flip_byte(part, 1000)  # a bit rotted in what was already on disk

    b.restart()
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    done = b.client.wait_download(MODEL, timeout=60)
    assert done.state == "done", done
    assert sha256sums(b.models_dir / MODEL) == sha256sums(transfer_model)
    assert "download.corrupt_file" in b.output(200) and first in b.output(200)


def test_cancel_keeps_partial_files_and_discard_removes_them(spawn_agent, transfer_model):
    a, b = spawn_agent("a", "--upload-limit", SLOW), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    wait_until(lambda: b.client.progress(MODEL).done_bytes > 1_000_000, 30, message="some progress")
    running = b.client.progress(MODEL)
    assert running.state == "running" and running.current_file and running.rate_bps > 0, running
    cancelled = b.client.cancel(MODEL)
    assert cancelled.state == "cancelled"
    assert (b.models_dir / ".partial" / MODEL).exists() and not (b.models_dir / MODEL).exists()
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    b.client.cancel(MODEL, discard=True)
    assert not (b.models_dir / ".partial" / MODEL).exists()


def test_short_of_disk_space_is_refused_before_starting(spawn_agent):
    b = spawn_agent("b")
    huge = Manifest(files={"model.safetensors": FileEntry(size=1 << 60, sha256="0" * 64)})
    with pytest.raises(AgentError) as err:
        b.client.fetch(MODEL, {"kind": "peer", "url": "http://127.0.0.1:9", "ticket": "x" * 20}, huge)
    assert err.value.status == 507 and err.value.code == "insufficient_disk_space"
    assert "disk space" in err.value.message
    assert b.client.downloads() == [] and not (b.models_dir / ".partial").exists()  # nothing was started


def test_a_mismatched_copy_is_repaired_reusing_its_good_files(spawn_agent, transfer_model):
    a, b = spawn_agent("a"), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, MODEL)
    copy_model(transfer_model, b.models_dir, MODEL)
    manifest = a.client.model(MODEL).manifest
    victim = "model-00001-of-00002.safetensors"
    flip_byte(b.models_dir / MODEL / victim, 12345)
    assert b.client.check(MODEL, manifest).mismatched == [victim]
    b.client.fetch_from_peer(MODEL, a.client, manifest)
    done = b.client.wait_download(MODEL, timeout=60)
    assert done.state == "done", done
    assert done.transferred_bytes == manifest.files[victim].size  # only the bad file crossed the network
    assert done.reused_bytes == manifest.total_bytes - manifest.files[victim].size
    assert b.client.check(MODEL, manifest, rehash=True).status == "present"
