"""The prompt cache's disk tier in process: entries written by a split's stages, read back by
fresh ones (a restart), serve the next turn bit for bit as the entries kept in memory did;
corrupt files and files of another model are ignored, never served."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import mlx.core as mx
import pytest

from orchestrator.engine.stage.disk_cache import DiskTier, model_hash
from orchestrator.engine.stage.shard import StageModel
from orchestrator.logs import EventLogger
from orchestrator.testmodels.families import FAMILIES, build_family_model
from tests.support.cache_rig import CachedRig
from tests.support.engine_harness import assert_same, reference

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 6
LOG = EventLogger("test-disk-cache")


def _split(model: Path) -> list[StageModel]:
    n = len(FAMILIES[model.name].layers)
    return [StageModel(model, 0, n // 2), StageModel(model, n // 2, n)]


def _tiers(root: Path, model: Path, stages: list[StageModel], budget: int = 1 << 30) -> list[DiskTier]:
    return [DiskTier(root, model, s.layer_range, budget, s.make_cache, LOG) for s in stages]


def _persist(rig: CachedRig, tiers: list[DiskTier]) -> None:
    """What a stage with the disk tier on does on every store: write the entry."""
    for entry in rig.index._entries.values():
        for store, tier in zip(rig.stores, tiers, strict=True):
            stored = store.entries[entry.id]
            mx.eval([c.state for c in stored.cache if not (type(c).__name__ == "KVCache" and c.keys is None)])
            tier.write(entry.tokens, stored.cache, entry.kind)


def _adopt(rig: CachedRig, tiers: list[DiskTier]) -> int:
    """What a restarted stage and its coordinator do: every stage's valid files, indexed when all hold them."""
    held = [{e.key: e for e in t.scan()} for t in tiers]
    common = set(held[0]).intersection(*held[1:])
    for key in sorted(common):
        first = held[0][key]
        entry = rig.index.add(list(first.tokens), first.kind)
        for i, (store, tier) in enumerate(zip(rig.stores, tiers, strict=True)):
            ack = store.store(entry, tier.load(held[i][key]), len(first.tokens), snapshot=False)
            rig.index.stored(i, entry, ack["bytes"], ack["trimmable"], ack["tokens"], ack["floor"])
    return len(common)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("disk-families")
    return {name: build_family_model(root / name, name) for name in ("llama", "gemma3_text", "falcon_h1")}


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "falcon_h1"])
def test_a_restarted_split_comes_back_warm_and_exact(models, tmp_path, family):
    model = models[family]
    first = reference(model, PROMPT, TOKENS, prefill_step=16)
    covered = PROMPT + first.tokens[:-1]
    turn2 = covered + [3, 1, 4, 1, 5]

    warm = CachedRig(_split(model), 16)
    warm.run(PROMPT, TOKENS)
    _persist(warm, _tiers(tmp_path, model, warm.stages))
    expected, reuse = warm.run(turn2, TOKENS)
    assert reuse is not None and reuse.keep == len(covered)

    restarted = CachedRig(_split(model), 16)  # fresh stages and index: only the files are left
    assert _adopt(restarted, _tiers(tmp_path, model, restarted.stages)) == 1
    got, reuse2 = restarted.run(turn2, TOKENS)
    assert reuse2 == reuse
    assert_same(expected, got)  # bit for bit what the entry kept in memory gave
    assert got.tokens == reference(model, turn2, TOKENS, prefill_step=16).tokens  # and the cold run's tokens


def test_corrupt_files_and_files_of_another_model_are_ignored(models, tmp_path, caplog):
    model = models["llama"]
    rig = CachedRig(_split(model), 16)
    rig.run(PROMPT, TOKENS)
    tiers = _tiers(tmp_path, model, rig.stages)
    _persist(rig, tiers)
    [good] = tiers[0].scan()

    other = tmp_path / "other-model"
    shutil.copytree(model, other)
    config = (other / "config.json").read_text()
    (other / "config.json").write_text(config.replace("{", '{"_other": 1, ', 1))
    assert model_hash(other) != model_hash(model)
    foreign = DiskTier(tmp_path / "elsewhere", other, rig.stages[0].layer_range, 1 << 30, rig.stages[0].make_cache,
                       LOG)
    foreign_file = foreign.write(good.tokens, tiers[0].load(good), "assistant")
    # Another model's entry for the same tokens and layers, put where this model's would be.
    shutil.copy(foreign_file, good.path)
    (tiers[0].root / ("0" * 40 + ".safetensors")).write_bytes(b"not a safetensors file at all")
    with caplog.at_level(logging.WARNING):
        assert tiers[0].scan() == []
    reasons = sorted(str(r.fields["reason"]) for r in caplog.records if r.getMessage() == "cache.disk_ignored")
    assert len(reasons) == 2 and "written for model" in reasons[1], reasons
    with pytest.raises(ValueError, match="written for model"):
        tiers[0].load(good)
    [other_stage] = tiers[1].scan()  # the other stage's file is untouched and still valid
    data = other_stage.path.read_bytes()
    other_stage.path.write_bytes(data[:len(data) // 2])  # cut short: its header still reads
    with pytest.raises((ValueError, RuntimeError, OSError)):
        tiers[1].load(other_stage)  # but it is never served (a stage refuses to adopt it)


def test_the_folder_is_bounded_least_recently_used_out_first(models, tmp_path):
    model = models["llama"]
    rig = CachedRig(_split(model), 16)
    stage = rig.stages[0]
    tier = DiskTier(tmp_path, model, stage.layer_range, 1 << 30, stage.make_cache, LOG)
    paths = []
    for n in range(3):
        rig.run([n + 1, *PROMPT[:20]], 2)
        entry = max(rig.index._entries)
        cache = rig.stores[0].entries[entry].cache
        paths.append(tier.write(rig.index._entries[entry].tokens, cache, "assistant"))
    size = paths[0].stat().st_size
    tier.load(tier.scan()[-1])  # the oldest file is used: the second one is now the least recent
    tier.budget = 2 * size
    gone = tier.evict()
    assert gone == [paths[1]]
    assert {e.path for e in tier.scan()} == {paths[0], paths[2]}


def test_a_failed_write_is_logged_and_leaves_no_file(models, tmp_path, caplog):
    model = models["llama"]
    rig = CachedRig(_split(model), 16)
    rig.run(PROMPT, 2)
    [entry] = rig.index._entries.values()
    tier = _tiers(tmp_path, model, rig.stages)[0]
    (tmp_path / "a-file").write_text("")
    tier.root = tmp_path / "a-file" / "below"  # cannot be written: stands in for a full or broken disk
    with caplog.at_level(logging.WARNING):
        assert tier.write(entry.tokens, rig.stores[0].entries[entry.id].cache, "assistant") is None
    assert any(r.getMessage() == "cache.disk_write_failed" for r in caplog.records)


def test_caches_mlx_lm_cannot_read_back_stay_in_memory_and_the_refusal_is_said_once(tmp_path, caplog):
    """DeepSeek-V4.1 keeps its own LayerCache, which `load_prompt_cache` cannot rebuild: no file is
    written (one that could never be served), the entries stay in memory, one warning says why."""
    model = build_family_model(tmp_path / "deepseek_v41", "deepseek_v41")
    rig = CachedRig(_split(model), 16)
    rig.run(PROMPT, 2)
    [entry] = rig.index._entries.values()
    tier = _tiers(tmp_path / "disk", model, rig.stages)[0]
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert tier.write(entry.tokens, rig.stores[0].entries[entry.id].cache, "assistant") is None
    said = [r for r in caplog.records if r.getMessage() == "cache.disk_unsupported"]
    assert len(said) == 1 and not list(tier.root.iterdir())
    assert rig.stores[0].entries[entry.id].tokens > 0  # still served from memory
