"""Model inventory (in-process): MLX detection with reasons, manifests and their cache, classification."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from orchestrator import logs
from orchestrator.agent import inventory as inv
from orchestrator.agent.inventory import Inventory, ModelNotFound
from orchestrator.agent.names import InvalidName
from orchestrator.agent.schemas import FileEntry, Manifest


@pytest.fixture
def models(tmp_path, test_model_dir) -> Inventory:
    root = tmp_path / "models"
    shutil.copytree(test_model_dir, root / "tm")
    return Inventory(root, tmp_path / "cache.json", logs.get("test"))


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """Records every file the inventory hashes."""
    seen: list[Path] = []
    real = inv.hash_file

    def spy(path: Path) -> tuple[str, dict | None]:
        seen.append(Path(path))
        return real(path)

    monkeypatch.setattr(inv, "hash_file", spy)
    return seen


def test_describe_a_test_model(models, test_model_dir):
    info = models.describe("tm")
    assert info.mlx_format and info.reason is None
    got = (info.model_type, info.family, info.supported, info.unsupported_reason)
    assert got == ("llama", "LlamaForCausalLM", True, None)
    assert (info.num_layers, info.hidden_size, info.dtype, info.quantization) == (4, 64, "float32", None)
    files = [p for p in test_model_dir.rglob("*") if p.is_file()]
    assert info.file_count == len(files) and info.total_bytes == sum(p.stat().st_size for p in files)
    assert [m.id for m in models.list()] == ["tm"]


def _edit_config(model: Path, **changes: object) -> None:
    cfg = json.loads((model / "config.json").read_text())
    cfg.update(changes)
    (model / "config.json").write_text(json.dumps(cfg))


def test_non_mlx_models_say_why(models):
    model = models.root / "tm"
    _edit_config(model, model_type="no_such_arch")
    assert "not supported by the installed mlx-lm" in models.describe("tm").reason
    _edit_config(model, model_type="llama", quantization={"bits": 4, "group_size": 64})
    assert models.describe("tm").quantization == "4-bit, group 64"
    (model / "tokenizer.json").rename(model / "tok.bak")
    assert "no tokenizer" in models.describe("tm").reason
    (model / "tok.bak").rename(model / "tokenizer.json")
    (model / "model.safetensors").rename(model / "pytorch_model.bin")
    info = models.describe("tm")
    assert not info.mlx_format and "PyTorch" in info.reason
    (model / "pytorch_model.bin").rename(model / "model.gguf")
    assert "GGUF" in models.describe("tm").reason
    (model / "model.gguf").rename(model / "model-00001-of-00002.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    assert "model-00002-of-00002.safetensors" in models.describe("tm").reason
    (model / "config.json").write_text("{oops")
    assert "not valid JSON" in models.describe("tm").reason
    (model / "config.json").unlink()
    assert models.describe("tm").reason == "no config.json"


def test_manifest_matches_sha256_and_is_cached_until_a_file_changes(models, hashes, tmp_path):
    model = models.root / "tm"
    manifest = models.manifest("tm")
    assert {p: e.sha256 for p, e in manifest.files.items()} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in model.iterdir()}
    assert len(hashes) == len(manifest.files)
    hashes.clear()
    assert models.manifest("tm") == manifest and hashes == []  # cached
    # A restarted agent reads the cache file.
    again = Inventory(models.root, tmp_path / "cache.json", logs.get("test"))
    assert again.manifest("tm") == manifest and hashes == []

    weights = model / "model.safetensors"
    st = weights.stat()
    with open(weights, "r+b") as f:  # same size, one byte flipped, old mtime put back
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = models.manifest("tm")
    assert hashes == [weights] and changed.files["model.safetensors"] != manifest.files["model.safetensors"]
    hashes.clear()
    models.manifest("tm", rehash=True)
    assert len(hashes) == len(manifest.files)


def test_check_classifies_present_needs_download_and_mismatch(models):
    reference = models.manifest("tm")
    assert models.check("tm", reference).status == "present"
    absent = models.check("other", reference)
    assert absent.status == "needs_download" and absent.missing == sorted(reference.files)
    (models.root / "tm" / "tokenizer.json").unlink()
    partial = models.check("tm", reference)
    assert partial.status == "needs_download" and partial.missing == ["tokenizer.json"]
    bad = Manifest(files={**reference.files, "config.json": FileEntry(size=1, sha256="0" * 64)})
    (models.root / "tm" / "extra.txt").write_text("?")
    result = models.check("tm", bad)
    assert result.status == "mismatch" and result.mismatched == ["config.json"] and result.unexpected == ["extra.txt"]
    assert "config.json" in result.message and "extra.txt" in result.message


def test_paths_never_leave_the_models_directory(models, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    os.symlink(secret, models.root / "tm" / "link.txt")
    os.symlink(tmp_path, models.root / "escape")
    (models.root / ".partial").mkdir()
    with pytest.raises(InvalidName):
        models.file_path("tm", "link.txt")
    with pytest.raises(InvalidName):
        models.model_dir("escape")
    for bad in ("../secret.txt", "/etc/passwd", "a/../../x"):
        with pytest.raises(InvalidName):
            models.file_path("tm", bad)
    with pytest.raises(ModelNotFound):
        models.file_path("tm", "absent.json")
    assert models.ids() == ["tm"]  # neither the escaping link nor the hidden work directory
    files, ignored = models.scan("tm")
    assert "link.txt" not in files and any(i.startswith("link.txt") for i in ignored)
    # A link to a file of another model inside the models directory is fine.
    shutil.copytree(models.root / "tm", models.root / "tm2", symlinks=True)
    os.symlink(models.root / "tm" / "config.json", models.root / "tm2" / "shared.json")
    assert models.file_path("tm2", "shared.json") == (models.root / "tm" / "config.json").resolve()


def test_the_agent_report_marks_models_the_engine_cannot_serve(spawn_agent, tmp_path):
    """A real agent, models built with mlx-lm's own classes: the report carries the support
    registry's verdict (and the planner's description only for what can be planned)."""
    from orchestrator.testmodels.families import build_family_model

    agent = spawn_agent("a", wait=False)
    models_dir = agent.models_dir
    build_family_model(models_dir / "qwen3", "qwen3")
    build_family_model(models_dir / "hybrid", "nemotron_h")  # layers given only by its pattern
    vlm = build_family_model(models_dir / "vlm", "llama")
    _edit_config(vlm, vision_config={"hidden_size": 32})
    bert = build_family_model(models_dir / "bert", "llama")
    _edit_config(bert, model_type="bert")
    odd = build_family_model(models_dir / "odd-quant", "llama", quant="q4")
    _edit_config(odd, quantization={"group_size": 64, "bits": 7})
    agent.wait_ready()
    report = {m.id: m for m in agent.client.report().models}

    for ok in ("qwen3", "hybrid"):
        assert report[ok].supported and report[ok].unsupported_reason is None and report[ok].mlx_format
    assert report["hybrid"].num_layers == 6 and report["hybrid"].description.layer_caches[0].kind == "state"
    assert report["vlm"].unsupported_reason == "llama is a multimodal model; pipeserve serves text-only decoders"
    assert report["bert"].unsupported_reason.startswith("model family 'bert' is not verified exact")
    assert report["odd-quant"].unsupported_reason == "7-bit affine quantization is not supported"
    for bad in ("vlm", "bert", "odd-quant"):
        assert not report[bad].supported
    # The MLX verdict stays what it is: a 7-bit llama is an MLX directory, bert is not one mlx-lm loads.
    assert report["odd-quant"].mlx_format and not report["bert"].mlx_format
    assert agent.client.model("bert").unsupported_reason == report["bert"].unsupported_reason
