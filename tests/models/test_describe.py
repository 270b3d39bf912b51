"""describe_model: sizes from safetensors headers only, checked against the real tensors."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from safetensors.numpy import save_file

from orchestrator.models import describe
from orchestrator.models.describe import ModelDescriptionError, describe_model, read_safetensors_header
from orchestrator.testmodels.llama import make_test_model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Test models in the layouts that matter: one file / shards, tied / untied, float32 / bf16."""
    root = tmp_path_factory.mktemp("describe")
    return {
        "single-tied-f32": make_test_model(root / "a"),
        "shards2-untied-bf16": make_test_model(root / "b", shards=2, tied=False, dtype="bfloat16"),
        "shards2-tied-f32": make_test_model(root / "c", shards=2, layers=5, hidden=32, heads=2, kv_heads=1),
        "single-untied-bf16": make_test_model(root / "d", tied=False, dtype="bfloat16", layers=3),
    }


def actual_sizes(model_dir: Path) -> dict[str, int]:
    """nbytes of every tensor, loaded for real with mlx."""
    out: dict[str, int] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update({k: v.nbytes for k, v in mx.load(str(f)).items()})
    return out


@pytest.mark.parametrize("key", ["single-tied-f32", "shards2-untied-bf16", "shards2-tied-f32", "single-untied-bf16"])
def test_sizes_match_the_real_tensors(models: dict[str, Path], key: str) -> None:
    path = models[key]
    d = describe_model(path)
    sizes = actual_sizes(path)
    cfg = json.loads((path / "config.json").read_text())
    assert d.num_layers == cfg["num_hidden_layers"]
    for i in range(d.num_layers):
        assert d.layer_bytes[i] == sum(v for k, v in sizes.items() if k.startswith(f"model.layers.{i}."))
    assert d.embedding_bytes == sizes["model.embed_tokens.weight"]
    assert d.norm_bytes == sizes["model.norm.weight"]
    assert d.head_bytes == sizes.get("lm_head.weight", 0)
    assert d.tied_embeddings == cfg["tie_word_embeddings"] == ("lm_head.weight" not in sizes)
    assert d.total_bytes == sum(sizes.values())
    assert d.other_bytes == 0
    assert len(d.weight_files) == (2 if "shards2" in key else 1)


def test_default_test_model_by_hand(models: dict[str, Path]) -> None:
    """4 layers, hidden 64, 4 heads, 2 KV heads, MLP 128, vocab 512, float32, tied."""
    d = describe_model(models["single-tied-f32"])
    per_layer = (64 * 64 + 32 * 64 + 32 * 64 + 64 * 64 + 3 * 128 * 64 + 2 * 64) * 4
    assert per_layer == 147_968
    assert d.layer_bytes == (per_layer,) * 4
    assert (d.embedding_bytes, d.norm_bytes, d.head_bytes) == (512 * 64 * 4, 64 * 4, 0)
    assert (d.num_attention_heads, d.num_key_value_heads, d.head_dim) == (4, 2, 16)
    assert (d.dtype, d.dtype_bytes, d.vocab_size, d.hidden_size) == ("float32", 4, 512, 64)
    assert (d.model_type, d.architecture, d.supported) == ("llama", "LlamaForCausalLM", True)
    assert d.quantization is None and d.max_position_embeddings == 2048
    assert d.kv_bytes_per_token_layer == 2 * 2 * 16 * 4
    assert d.name == models["single-tied-f32"].name


def test_bf16_untied_by_hand(models: dict[str, Path]) -> None:
    d = describe_model(models["shards2-untied-bf16"])
    assert (d.dtype, d.dtype_bytes) == ("bfloat16", 2)
    assert d.layer_bytes == (147_968 // 2,) * 4
    assert d.head_bytes == d.embedding_bytes == 512 * 64 * 2
    assert d.kv_bytes_per_token_layer == 2 * 2 * 16 * 2


def test_stage_weight_bytes_agree_with_the_engine(models: dict[str, Path]) -> None:
    """The engine's stage reports weight_bytes; the tiny model's stages measured 427,008 and 427,264."""
    d = describe_model(models["single-tied-f32"])
    assert 2 * d.layer_bytes[0] + d.embedding_bytes == 427_008  # stage 0: layers 0-1 + embedding
    assert 2 * d.layer_bytes[0] + d.embedding_bytes + d.norm_bytes == 427_264  # stage 1: tied head + norm


def write_safetensors(path: Path, header: dict, data: bytes = b"", length: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)


class CountedFile:
    """A file opened for reading that counts the bytes read from it."""

    def __init__(self, path: Path, mode: str) -> None:
        self.name = Path(path).name
        self._file = open(path, mode)  # closed by __exit__
        self.read_bytes = 0

    def __enter__(self) -> CountedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()

    def read(self, n: int = -1) -> bytes:
        data = self._file.read(n)
        self.read_bytes += len(data)
        return data


def test_reads_headers_only(tmp_path: Path, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A 40 GB tensor in a sparse file is described from its header: the data is never read."""
    model = Path(shutil.copytree(models["single-tied-f32"], tmp_path / "m"))
    entries = read_safetensors_header(model / "model.safetensors")
    big = 10 * 1024**3  # float32 elements
    offset = max(e["nbytes"] for e in entries.values())  # any offset inside the file works for the check
    header = {name: {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [0, e["nbytes"]]}
              for name, e in entries.items()}
    header["model.layers.3.mlp.huge.weight"] = {"dtype": "F32", "shape": [big],
                                                "data_offsets": [offset, offset + 4 * big]}
    raw = json.dumps(header).encode()
    with open(model / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset + 4 * big)  # sparse: no data on disk
    opened: list[CountedFile] = []

    def counted_open(path: Path, mode: str = "r") -> CountedFile:
        opened.append(CountedFile(path, mode))
        return opened[-1]

    monkeypatch.setattr(describe, "open", counted_open, raising=False)  # describe's own reads go through it
    d = describe_model(model)
    weights = [f for f in opened if f.name == "model.safetensors"]
    assert weights and all(f.read_bytes == 8 + len(raw) for f in weights)  # the length prefix and the header
    assert d.layer_bytes[3] == 147_968 + 4 * big


def test_quantized_model(tmp_path: Path) -> None:
    """MLX quantized layout: packed uint32 weights with float16 scales and biases; KV in float16."""
    hidden, layers, vocab = 64, 2, 300
    tensors: dict[str, np.ndarray] = {}

    def quantized(name: str, rows: int, cols: int) -> None:
        tensors[f"{name}.weight"] = np.zeros((rows, cols // 8), np.uint32)
        tensors[f"{name}.scales"] = np.zeros((rows, cols // 64), np.float16)
        tensors[f"{name}.biases"] = np.zeros((rows, cols // 64), np.float16)

    quantized("model.embed_tokens", vocab, hidden)
    for i in range(layers):
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            quantized(f"model.layers.{i}.self_attn.{proj}", hidden, hidden)
        tensors[f"model.layers.{i}.input_layernorm.weight"] = np.ones(hidden, np.float16)
    tensors["model.norm.weight"] = np.ones(hidden, np.float16)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "mistral", "num_hidden_layers": layers, "hidden_size": hidden, "vocab_size": vocab,
        "num_attention_heads": 8, "num_key_value_heads": 2, "quantization": {"group_size": 64, "bits": 4},
        "torch_dtype": "bfloat16"}))
    d = describe_model(tmp_path)
    assert d.quantization is not None and (d.quantization.bits, d.quantization.group_size) == (4, 64)
    assert (d.dtype, d.dtype_bytes, d.head_dim, d.supported, d.tied_embeddings) == ("float16", 2, 8, True, True)
    per_proj = hidden * hidden // 8 * 4 + 2 * hidden * 2
    assert d.layer_bytes == (4 * per_proj + hidden * 2,) * layers
    assert d.embedding_bytes == vocab * hidden // 8 * 4 + 2 * vocab * 2


def _good(tmp: Path) -> Path:
    """A minimal valid directory: 1 layer, tied."""
    (tmp / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 2,
                                                 "vocab_size": 3, "num_attention_heads": 1}))
    save_file({"model.embed_tokens.weight": np.zeros((3, 2), np.float32),
               "model.layers.0.input_layernorm.weight": np.zeros(2, np.float32),
               "model.norm.weight": np.zeros(2, np.float32)}, str(tmp / "model.safetensors"))
    return tmp


def test_minimal_directory_is_valid(tmp_path: Path) -> None:
    d = describe_model(_good(tmp_path))
    assert (d.layer_bytes, d.embedding_bytes, d.head_dim, d.num_key_value_heads) == ((8,), 24, 2, 1)


def _config(**changes: object):
    def edit(tmp: Path) -> None:
        cfg = json.loads((tmp / "config.json").read_text())
        cfg.update(changes)
        (tmp / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return edit


def _tensors(tensors: dict[str, np.ndarray]):
    def edit(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"))
    return edit


def _raw(header: dict, data: bytes = b"", length: int | None = None):
    def edit(tmp: Path) -> None:
        write_safetensors(tmp / "model.safetensors", header, data, length)
    return edit


def _shards(index: object, files: tuple[str, ...] = ()):
    def edit(tmp: Path) -> None:
        (tmp / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))
        for name in files:
            shutil.copy(tmp / "model.safetensors", tmp / name)
    return edit


EMB = {"model.embed_tokens.weight": np.zeros((3, 2), np.float32)}
LAYER = {"model.layers.0.input_layernorm.weight": np.zeros(2, np.float32)}

BAD = [
    ("no config", lambda t: (t / "config.json").unlink(), "no config.json"),
    ("config not json", lambda t: (t / "config.json").write_text("{"), "not valid JSON"),
    ("config not object", lambda t: (t / "config.json").write_text("[1]"), "not a JSON object"),
    ("no model_type", _config(model_type=None), "no model_type"),
    ("no layers", _config(num_hidden_layers=None), "missing num_hidden_layers"),
    ("bad hidden", _config(hidden_size="2"), "hidden_size must be a positive integer"),
    ("no weights", lambda t: (t / "model.safetensors").unlink(), "no model*.safetensors"),
    ("index invalid", _shards("{}"), "not a valid safetensors index"),
    ("shard missing", _shards({"weight_map": {"x": "model-00002-of-00002.safetensors"}}), "missing"),
    ("duplicate across shards", _shards({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}},
                                        ("model-1.safetensors", "model-2.safetensors")), "appears in two weight files"),
    ("short file", lambda t: (t / "model.safetensors").write_bytes(b"\x01"), "too short"),
    ("huge header length", _raw({}, length=10**12), "implausible"),
    ("truncated header", _raw({}, length=1000), "header truncated"),
    ("header not json", lambda t: (t / "model.safetensors").write_bytes(struct.pack("<Q", 3) + b"abc"), "not JSON"),
    ("header not object", _raw([]), "not a JSON object"),  # type: ignore[arg-type]
    ("malformed entry", _raw({"model.norm.weight": {"dtype": "F32"}}), "malformed header entry"),
    ("outside the file", _raw({"model.norm.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}),
     "outside the file"),
    ("shape mismatch", _raw({"model.norm.weight": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
                            b"\0" * 8), "its shape needs 12"),
    ("layer beyond config", _tensors({**EMB, **LAYER, "model.layers.1.x": np.zeros(1, np.float32)}),
     "beyond the 1 layers"),
    ("layer without tensors", _config(num_hidden_layers=3), "no tensors for layer(s) 1-2 of 3"),
    ("no embedding", _tensors(LAYER), "no model.embed_tokens"),
    ("untied without head", _config(tie_word_embeddings=False), "no lm_head"),
    ("cache rule's key missing", _config(model_type="olmo3"),
     "cannot tell what each layer caches (missing 'sliding_window')"),
]


@pytest.mark.parametrize("case,edit,message", BAD, ids=[b[0] for b in BAD])
def test_bad_directories_raise_a_clear_error(tmp_path: Path, case: str, edit, message: str) -> None:
    edit(_good(tmp_path))
    with pytest.raises(ModelDescriptionError, match=re.escape(message)):
        describe_model(tmp_path)


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelDescriptionError, match="not a directory"):
        describe_model(tmp_path / "absent")


# family -> whether its test model has its own head: nemotron_h (backbone.*, lm_head),
# qwen3_5_moe (language_model.*), llama4_text (output.*) and gpt_oss (no tie key in its
# config) do; jamba ties in config.json, gemma3_text publishes no head and no tie key.
# Embeddings and final norms by other names: bailing_moe (word_embeddings), internlm2
# (tok_embeddings, output), lfm2 (embedding_norm after the last layer), falcon_h1
# (final_layernorm), longcat_flash (num_layers instead of num_hidden_layers).
OWN_HEAD = {"nemotron_h": True, "jamba": False, "qwen3_5_moe": True, "gpt_oss": True, "gemma3_text": False,
            "llama4_text": True, "bailing_moe": True, "internlm2": True, "lfm2": False, "falcon_h1": True,
            "longcat_flash": True}


@pytest.mark.parametrize("family", sorted(OWN_HEAD))
def test_every_family_layout_is_grouped(tmp_path, family):
    """Each family's own tensor names (backbone.*, language_model.model.*, final_layernorm,
    output) land in layers / embedding / norm / head, nothing in 'other'."""
    from orchestrator.testmodels.families import FAMILIES, build_family_model

    d = describe_model(build_family_model(tmp_path / family, family))
    assert d.supported and d.num_layers == len(FAMILIES[family].layers) == len(d.layer_caches)
    assert d.other_bytes == 0 and all(d.layer_bytes) and d.embedding_bytes and d.norm_bytes
    assert (d.head_bytes > 0, d.tied_embeddings) == (OWN_HEAD[family], not OWN_HEAD[family])


def test_a_vision_language_config_is_described_but_unsupported(tmp_path):
    from orchestrator.testmodels.families import build_family_model

    model = build_family_model(tmp_path / "vlm", "llama")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "vision_config": {"hidden_size": 32}}))
    d = describe_model(model)
    assert not d.supported and "multimodal" in d.unsupported_reason and d.layer_caches == ()
