"""Per-block digests (orchestrator/agent/copy/blocks.py): produced only with the whole-file sha256, from the
same bytes; kept through the inventory's cache; never invented later for a cached hash."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from orchestrator import logs
from orchestrator.agent import inventory as inv
from orchestrator.agent.copy import blocks
from orchestrator.agent.inventory import Inventory
from orchestrator.agent.schemas import FileEntry, Manifest

MIB = 1 << 20


def independent_blocks(data: bytes, bsize: int) -> list[str]:
    return [hashlib.sha256(data[i:i + bsize]).hexdigest() for i in range(0, len(data), bsize)]


@pytest.fixture
def small_blocks(monkeypatch):
    """1 MiB blocks (the smallest a manifest takes), so a few-MB file has several."""
    monkeypatch.setattr(blocks, "MIN_BLOCK", MIB)
    monkeypatch.setattr(blocks, "READ_CHUNK", 256 << 10)


def test_block_size_keeps_a_file_under_64_blocks():
    assert blocks.block_size(16 * MIB) is None  # one block: the whole-file hash is as parallel
    assert blocks.block_size(16 * MIB + 1) == 16 * MIB
    assert blocks.block_size(538_090_233) == 16 * MIB  # the demo model's weights: 33 blocks
    assert blocks.block_size(5_000_000_000) == 128 * MIB  # a 5 GB shard: 38 blocks
    for size in (17 * MIB, 1 << 30, 1 << 36, (1 << 40) - 1):
        assert -(-size // blocks.block_size(size)) <= blocks.MAX_BLOCKS


def test_hash_file_gives_the_whole_sha256_and_each_blocks_from_one_pass(small_blocks, tmp_path):
    data = os.urandom(5 * MIB + 12345)
    (tmp_path / "w").write_bytes(data)
    whole, got = blocks.hash_file(tmp_path / "w")
    assert whole == hashlib.sha256(data).hexdigest()
    assert got == {"size": MIB, "sha256": independent_blocks(data, MIB)}
    entry = FileEntry(size=len(data), sha256=whole, blocks=got)  # a valid manifest entry
    assert entry == FileEntry(size=len(data), sha256=whole)  # blocks never change what the file is
    (tmp_path / "s").write_bytes(data[:MIB])
    assert blocks.hash_file(tmp_path / "s") == (hashlib.sha256(data[:MIB]).hexdigest(), None)


def test_a_file_that_changes_size_while_hashed_gets_no_blocks(small_blocks, tmp_path):
    data = os.urandom(3 * MIB)
    (tmp_path / "w").write_bytes(data)

    class Grown(type(tmp_path)):  # stat says one byte more than the pass will read
        def stat(self, *args, **kwargs):
            real = os.stat(self)
            return os.stat_result((*real[:6], real.st_size + 1, *real[7:]))

    whole, got = blocks.hash_file(Grown(tmp_path / "w"))
    assert whole == hashlib.sha256(data).hexdigest() and got is None


def test_manifest_entries_reject_blocks_that_do_not_cover_the_file():
    with pytest.raises(ValueError):
        FileEntry(size=3 * MIB, sha256="a" * 64, blocks={"size": MIB, "sha256": ["b" * 64] * 2})
    with pytest.raises(ValueError):  # blocks under 1 MiB: a manifest stays small
        FileEntry(size=3 * 1024, sha256="a" * 64, blocks={"size": 1024, "sha256": ["b" * 64] * 3})
    plain = Manifest(files={"a": FileEntry(size=1, sha256="a" * 64)})
    assert "blocks" not in plain.model_dump_json()  # what an older agent expects to read


@pytest.fixture
def models(tmp_path, small_blocks) -> Inventory:
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    (root / "m" / "w.safetensors").write_bytes(os.urandom(4 * MIB + 7))
    (root / "m" / "config.json").write_text("{}")
    return Inventory(root, tmp_path / "cache.json", logs.get("test"))


def test_the_inventory_records_blocks_with_the_sha256_and_keeps_them_cached(models, tmp_path):
    data = (models.root / "m" / "w.safetensors").read_bytes()
    entry = models.manifest("m").files["w.safetensors"]
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert entry.blocks is not None and entry.blocks.sha256 == independent_blocks(data, MIB)
    assert models.manifest("m").files["config.json"].blocks is None
    again = Inventory(models.root, tmp_path / "cache.json", logs.get("test"))  # a restarted agent
    assert again.manifest("m").files["w.safetensors"].blocks == entry.blocks


def test_a_cached_hash_never_gets_blocks_computed_later_from_the_bytes_now_on_disk(models, tmp_path, monkeypatch):
    """A cache entry without blocks (an older agent's) names the sha256 the file had when it was
    hashed. Blocks computed now would come from the bytes now on disk — rotted, perhaps — and
    could vouch for other bytes than that sha256; so the entry stays without blocks until the
    file is hashed again, whole and blocks in one pass."""
    models.manifest("m")
    cache = json.loads((tmp_path / "cache.json").read_text())
    w = cache["m"]["w.safetensors"]
    cache["m"]["w.safetensors"] = w[:4] + ["e" * 64]  # hashed when it was other bytes; no blocks
    (tmp_path / "cache.json").write_text(json.dumps(cache))
    old = Inventory(models.root, tmp_path / "cache.json", logs.get("test"))
    hashed: list[Path] = []
    real = inv.hash_file
    monkeypatch.setattr(inv, "hash_file", lambda p: hashed.append(p) or real(p))
    entry = old.manifest("m").files["w.safetensors"]
    assert entry.sha256 == "e" * 64 and entry.blocks is None and hashed == []
    fresh = old.manifest("m", rehash=True).files["w.safetensors"]
    data = (models.root / "m" / "w.safetensors").read_bytes()
    assert fresh.sha256 == hashlib.sha256(data).hexdigest()
    assert fresh.blocks is not None and fresh.blocks.sha256 == independent_blocks(data, MIB)


def test_record_keeps_the_blocks_a_download_verified(models):
    manifest = models.manifest("m")
    models.forget("m")
    models.record("m", manifest)  # as after a verified copy
    assert models.manifest("m").files["w.safetensors"].blocks == manifest.files["w.safetensors"].blocks
