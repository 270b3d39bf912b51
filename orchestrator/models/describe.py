"""What a model directory holds, in bytes, read from config.json and safetensors headers only.

The planner needs the size of every layer, of the embedding, the final norm and the head,
and the KV-cache geometry; the node agent needs the same facts to describe its models.
Both read them here. Only the header of each safetensors file is read (an 8-byte
little-endian length, then that many bytes of JSON naming every tensor's dtype, shape and
byte range), never the tensor data, so describing a 100 GB model costs a few kilobytes
of I/O. This module imports neither mlx nor the control plane.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from orchestrator.families.decoder_config import (
    HIDDEN_KEYS,
    ModelConfigError,
    decoder_view,
    layer_count,
    read_config_file,
)
from orchestrator.families.support import PER_LAYER_INPUTS, family_of, shared_kv_cuts, unsupported_reason
from orchestrator.models.boundaries import boundary_bytes, received_cache_bytes
from orchestrator.models.kv import LayerCache, layer_caches

INDEX_FILE = "model.safetensors.index.json"
# The safetensors format itself refuses headers above 100 MB; a bigger length is corruption.
MAX_HEADER_BYTES = 100_000_000

# Element sizes of the safetensors dtypes, to check each entry's byte range against its shape.
SAFETENSORS_DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
# Floating dtypes an activation (and so the KV cache) can have, by safetensors name.
ACTIVATION_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
CONFIG_DTYPES = {"float32": "float32", "float": "float32", "bfloat16": "bfloat16",
                 "float16": "float16", "half": "float16"}

# Where families keep their decoder stack: model.layers (most), backbone.layers (Nemotron-H),
# language_model.model.layers (multimodal checkpoints that nest the text model) and
# model.language_model.layers (their newer Hugging Face layout). Anchored to these prefixes
# so a vision tower's own "layers" never counts as the language model's.
_ROOT = r"^(?:model\.)?(?:language_model\.)?(?:model\.|backbone\.|transformer\.)?"
# The decoder stack: layers (most), h (GPT-2, GPT-J, GPT-NeoX, Qwen 1), blocks (DBRX) and
# PLaMo's layers.layers.
_LAYER = re.compile(_ROOT + r"(?:layers\.layers|layers|h|blocks)\.(\d+)\.")
# A second layer list after the first (AFM's KV-reuse layers, model.kv_reuse_layers): its layer j
# is layer num_layers - len(list) + j of the model (the engine's one index over both lists).
_SECOND_LAYERS = {"afm7": (re.compile(_ROOT + r"kv_reuse_layers\.(\d+)\."), "num_kv_reuse_layers")}
# Towers beside the text decoder (vision encoders, their projectors, audio towers): the
# family's mlx-lm sanitize() drops them, so no stage ever holds them.
_TOWER = re.compile(r"^(?:model\.)?(?:vision_tower|vision_model|visual|multi_modal_projector|mm_projector|"
                    r"vision_embed|audio_tower|audio_model|embed_vision|embed_audio)\.")
# Embedding names: embed_tokens (most), embeddings (Nemotron-H, Mamba), word_embeddings (Ling /
# bailing_moe, LongCat n-gram's), tok_embeddings (InternLM2, Lille), wte / wpe (GPT-2's token and
# learned position embeddings; Phixtral's embd.wte), embed_in (GPT-NeoX), token_embeddings (OpenELM),
# embedding (Spark), embed (Talkie).
_EMBEDDING = re.compile(_ROOT + r"(?:ngram_embeddings\.|embd\.)?(?:embed_tokens|embeddings|word_embeddings|"
                        r"tok_embeddings|wte|wpe|embed_in|token_embeddings|embedding|embed)\.")
# Final norms: norm, norm_f (Nemotron-H, DBRX), final_layernorm (Jamba, Falcon-H1), ln_f (GPT-2),
# final_layer_norm (GPT-NeoX), AFM's output_norm and LFM2's embedding_norm, which despite its name
# runs after the last layer.
_NORM = re.compile(_ROOT + r"(?:norm|norm_f|final_layernorm|embedding_norm|ln_f|final_layer_norm|output_norm)\.")
# Families whose mlx-lm code always projects with the embedding, whatever config.json says
# (lfm2-vl.py even sets tie_word_embeddings to False for its lfm2 decoder).
ALWAYS_TIED = frozenset({"lfm2", "lfm2_moe", "lfm2_vl"})
# Heads: lm_head (with Phixtral's own final norm inside, lm_head.ln; Talkie's a bare matrix named
# just lm_head), output, embed_out (GPT-NeoX).
_HEAD = re.compile(_ROOT + r"(?:lm_head(?:\.|$)|output\.|embed_out\.)")


class ModelDescriptionError(ValueError):
    """The directory is not a model this module can describe; the message says which file and why."""


class Quantization(BaseModel):
    """The `quantization` block of an MLX config.json (weights only: activations stay float)."""

    model_config = ConfigDict(frozen=True)

    bits: int
    group_size: int | None = None
    mode: str | None = None


class ModelDescription(BaseModel):
    """Sizes and geometry of one model directory (all byte counts are tensor data bytes)."""

    model_config = ConfigDict(frozen=True)

    name: str  # the directory name, for messages
    model_type: str
    architecture: str | None  # first of config.json "architectures", e.g. LlamaForCausalLM
    # Why the engine cannot serve the model exactly (orchestrator.families.support), or None.
    unsupported_reason: str | None = None
    num_layers: int
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int | None = None
    dtype: str  # activation dtype: float32, bfloat16 or float16; the KV cache is stored in it
    dtype_bytes: int  # its element size
    quantization: Quantization | None = None
    layer_bytes: tuple[int, ...]  # bytes of model.layers.{i}.* for every layer i (AFM: then its kv_reuse_layers)
    embedding_bytes: int  # model.embed_tokens.*
    norm_bytes: int  # model.norm.* (the final norm)
    head_bytes: int  # lm_head.*; 0 when tied (the head is then the embedding matrix)
    other_bytes: int  # tensors outside those groups; every stage keeps them
    # Parts only the first stage holds besides the embedding (Gemma 4's per-layer embedding and
    # projection: support.PER_LAYER_INPUTS).
    first_stage_bytes: int = 0
    # Tensors of towers beside the text decoder (a vision encoder): in the files, never loaded.
    tower_bytes: int = 0
    weight_files: tuple[str, ...]
    # What every layer caches per request (models/kv.py); empty in descriptions from older
    # agents, which then count standard attention in every layer.
    layer_caches: tuple[LayerCache, ...] = ()
    # Layers no stage may start at (support.shared_kv_cuts: Gemma 4's KV-shared layers stay
    # on the stage of the layers whose K/V they reuse): the planner never cuts there.
    refused_boundaries: tuple[int, ...] = ()
    # Bytes one token puts on the wire at each boundary before layer b (index b - 1) beyond the
    # frame header: the hidden state, plus, for a family that passes more, the NAMED frame's
    # other tensors and directory (support.boundary_tensors). Empty: the hidden state alone.
    boundary_bytes: tuple[int, ...] = ()
    # Cache bytes per token that the stage starting at boundary b (index b - 1) keeps of what it
    # receives there (DeepSeek-V4.1's compressed K/V entries, appended to its first layer's
    # cache: families/hyper_layout.py). Empty: none.
    received_cache_bytes: tuple[int, ...] = ()

    @property
    def supported(self) -> bool:
        """Whether the engine serves this model exactly."""
        return self.unsupported_reason is None

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor a stage may load (the embedding counted once; towers not)."""
        return (sum(self.layer_bytes) + self.embedding_bytes + self.norm_bytes + self.head_bytes + self.other_bytes
                + self.first_stage_bytes)

    @property
    def kv_bytes_per_token_layer(self) -> int:
        """KV-cache bytes one token costs in one layer: keys and values."""
        return 2 * self.num_key_value_heads * self.head_dim * self.dtype_bytes


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensor entries of one safetensors file {name: {dtype, shape, data_offsets}}.

    Reads only the length prefix and the JSON header; checks that every entry's byte range
    lies inside the file and matches its shape, so sizes derived from it can be trusted.
    """
    try:
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) != 8:
                raise ModelDescriptionError(f"{path}: too short for a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise ModelDescriptionError(f"{path}: header length {length} is implausible (corrupt file?)")
            raw = f.read(length)
        size = path.stat().st_size
    except OSError as exc:
        raise ModelDescriptionError(f"{path}: {exc.strerror or exc}") from None
    if len(raw) != length:
        raise ModelDescriptionError(f"{path}: header truncated ({len(raw)} of {length} bytes)")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelDescriptionError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ModelDescriptionError(f"{path}: header is not a JSON object")
    data_bytes = size - 8 - length
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _check_entry(path, name, entry, data_bytes)
    return entries


def _check_entry(path: Path, name: str, entry: Any, data_bytes: int) -> dict[str, Any]:
    try:
        dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not (isinstance(start, int) and isinstance(end, int) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise TypeError
    except (TypeError, KeyError, ValueError):
        raise ModelDescriptionError(f"{path}: tensor {name!r} has a malformed header entry") from None
    if not 0 <= start <= end <= data_bytes:
        raise ModelDescriptionError(f"{path}: tensor {name!r} lies outside the file (truncated?)")
    element = SAFETENSORS_DTYPE_BYTES.get(dtype)
    if element is not None and math.prod(shape) * element != end - start:
        raise ModelDescriptionError(f"{path}: tensor {name!r} has {end - start} bytes, its shape needs "
                                    f"{math.prod(shape) * element}")
    return {"dtype": dtype, "shape": list(shape), "nbytes": end - start}


def weight_files(model_dir: Path) -> list[str]:
    """The safetensors files of a model: those its index names, else `model*.safetensors` (as mlx-lm)."""
    index = model_dir / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
            if not all(isinstance(n, str) for n in names):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise ModelDescriptionError(f"{index}: not a valid safetensors index (needs a weight_map)") from None
        for n in names:
            if "/" in n or "\\" in n or n.startswith(".") or not (model_dir / n).is_file():
                raise ModelDescriptionError(f"{model_dir}: shard {n!r} named by the index is missing")
        return names
    names = sorted(p.name for p in model_dir.glob("model*.safetensors") if p.is_file())
    if not names:
        raise ModelDescriptionError(f"{model_dir}: no model*.safetensors weights")
    return names


def _read_config(model_dir: Path) -> tuple[dict[str, Any], str | None]:
    try:
        cfg = read_config_file(model_dir)
    except ModelConfigError as exc:
        raise ModelDescriptionError(str(exc)) from None
    # The registry judges the config as written (a vision_config beside text_config makes it
    # a multimodal checkpoint served by its text decoder, or refused).
    verdict = unsupported_reason(cfg)
    return decoder_view(cfg), verdict


def _int(cfg: dict[str, Any], path: Path, *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelDescriptionError(f"{path}: {key} must be a positive integer, got {value!r}")
            return value
    if default is None:
        raise ModelDescriptionError(f"{path}: missing {keys[0]}")
    return default


def _quantization(cfg: dict[str, Any]) -> Quantization | None:
    block = cfg.get("quantization") or cfg.get("quantization_config")
    if not isinstance(block, dict) or not isinstance(block.get("bits"), int):
        return None
    group = block.get("group_size")
    mode = block.get("mode")
    return Quantization(bits=block["bits"], group_size=group if isinstance(group, int) else None,
                        mode=mode if isinstance(mode, str) else None)


def _activation_dtype(entries: dict[str, dict[str, Any]], cfg: dict[str, Any], path: Path) -> str:
    """The dtype activations (and the KV cache) run in.

    The engine takes it from the first layer's input norm (quantized models keep norms and
    quantization scales in the activation dtype), so this does too; families that name that
    norm otherwise get the float dtype holding the most bytes (a few vectors, such as router
    biases or SSM decays, may stay float32 in a bfloat16 model, never most of it); then
    config.json's torch_dtype.
    """
    norm = entries.get("model.layers.0.input_layernorm.weight")
    if norm is not None and norm["dtype"] in ACTIVATION_DTYPES:
        return ACTIVATION_DTYPES[norm["dtype"]]
    by_dtype: dict[str, int] = {}
    for entry in entries.values():
        if entry["dtype"] in ACTIVATION_DTYPES:
            by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + entry["nbytes"]
    if by_dtype:
        return ACTIVATION_DTYPES[max(sorted(by_dtype), key=by_dtype.__getitem__)]
    declared = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(declared, str) and declared in CONFIG_DTYPES:
        return CONFIG_DTYPES[declared]
    raise ModelDescriptionError(f"{path}: cannot tell the activation dtype (no float tensor, no torch_dtype)")


def describe_model(model_dir: str | Path) -> ModelDescription:
    """Describe a model directory from config.json and its safetensors headers.

    Works with one `model.safetensors` and with HF-style shards listed by
    `model.safetensors.index.json`. Raises ModelDescriptionError for anything unusable.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelDescriptionError(f"{model_dir}: not a directory")
    cfg, verdict = _read_config(model_dir)
    cfg_path = model_dir / "config.json"
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ModelDescriptionError(f"{cfg_path}: no model_type")
    try:
        num_layers = layer_count(cfg)
    except ModelConfigError as exc:
        raise ModelDescriptionError(f"{cfg_path}: {str(exc).removeprefix('config.json: ')}") from None
    if num_layers is None:
        raise ModelDescriptionError(f"{cfg_path}: missing num_hidden_layers")
    hidden = _int(cfg, cfg_path, *HIDDEN_KEYS)
    vocab = _int(cfg, cfg_path, "vocab_size")
    # Attention-free families (Mamba) give no heads; DBRX and OpenELM keep theirs elsewhere.
    attn_cfg = cfg.get("attn_config") if isinstance(cfg.get("attn_config"), dict) else {}
    heads = _int(_first_of_lists(cfg), cfg_path, "num_attention_heads", "n_head", "n_heads", "num_heads",
                 "num_query_heads", default=1)
    kv_heads = _int({**_first_of_lists(cfg), **attn_cfg}, cfg_path, "num_key_value_heads", "n_kv_heads",
                    "num_kv_heads", "kv_n_heads", default=heads)
    head_dim = _int(cfg, cfg_path, "head_dim", default=max(1, hidden // heads))
    max_pos = cfg.get("max_position_embeddings")

    files = weight_files(model_dir)
    entries: dict[str, dict[str, Any]] = {}
    for name in files:
        for tensor, entry in read_safetensors_header(model_dir / name).items():
            if tensor in entries:
                raise ModelDescriptionError(f"{model_dir}: tensor {tensor!r} appears in two weight files")
            entries[tensor] = entry

    layers = [0] * num_layers
    seen = [False] * num_layers
    embedding = norm = head = other = tower = first_only = 0
    first_parts = tuple(f".{part}." for part in PER_LAYER_INPUTS.get(family_of(cfg) or "", ()))
    second, second_key = _SECOND_LAYERS.get(family_of(cfg) or "", (None, ""))
    second_start = num_layers - int(cfg.get(second_key) or 0) if second is not None else num_layers
    for tensor, entry in entries.items():
        nbytes = entry["nbytes"]
        match = _LAYER.match(tensor)
        later = second.match(tensor) if second is not None else None
        if _TOWER.match(tensor):
            tower += nbytes
        elif first_parts and any(part in f".{tensor}" for part in first_parts):
            first_only += nbytes
        elif match or later:
            i = int(match.group(1)) if match else second_start + int(later.group(1))
            if i >= num_layers:
                raise ModelDescriptionError(f"{model_dir}: tensor {tensor!r} is beyond the {num_layers} layers "
                                            "config.json declares")
            layers[i] += nbytes
            seen[i] = True
        elif _EMBEDDING.match(tensor):
            embedding += nbytes
        elif _NORM.match(tensor):
            norm += nbytes
        elif _HEAD.match(tensor):
            head += nbytes
        else:
            other += nbytes
    missing = [i for i, s in enumerate(seen) if not s]
    if missing:
        raise ModelDescriptionError(f"{model_dir}: no tensors for layer(s) {_ranges(missing)} of {num_layers}")
    if embedding == 0:
        raise ModelDescriptionError(f"{model_dir}: no model.embed_tokens tensors (nor another family's embedding name)")
    # Tied when config.json says so (mlx-lm then drops a stray lm_head) or when there is no
    # head at all: families whose ModelArgs tie by default (Gemma) publish none, and
    # families that default to untied (GPT-OSS, GLM-4) publish one without saying.
    declared = cfg.get("tie_word_embeddings")
    tied = declared is True or (declared is None and head == 0) or (head == 0 and family_of(cfg) in ALWAYS_TIED)
    if tied:
        head = 0  # mlx-lm drops a stray lm_head of a tied model; the embedding serves as the head
    elif head == 0:
        raise ModelDescriptionError(f"{model_dir}: config.json says the embeddings are untied but there is no lm_head")

    dtype = _activation_dtype(entries, cfg, cfg_path)
    # An unsupported family is refused before its caches matter; its config may lack the
    # keys the rules read.
    caches = _layer_caches(cfg, num_layers, DTYPE_BYTES[dtype], cfg_path) if verdict is None else ()
    archs = cfg.get("architectures")
    return ModelDescription(
        name=model_dir.resolve().name,
        model_type=model_type,
        architecture=archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None,
        unsupported_reason=verdict,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        tied_embeddings=tied,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) else None,
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES[dtype],
        quantization=_quantization(cfg),
        layer_bytes=tuple(layers),
        embedding_bytes=embedding,
        norm_bytes=norm,
        head_bytes=head,
        other_bytes=other,
        first_stage_bytes=first_only,
        tower_bytes=tower,
        weight_files=tuple(files),
        layer_caches=caches,
        refused_boundaries=tuple(sorted(shared_kv_cuts(cfg))),
        boundary_bytes=boundary_bytes(cfg, num_layers, hidden, DTYPE_BYTES[dtype]),
        received_cache_bytes=received_cache_bytes(cfg, num_layers, DTYPE_BYTES[dtype]),
    )


def _first_of_lists(cfg: dict[str, Any]) -> dict[str, Any]:
    """OpenELM gives head counts per layer: its first layer's stand for the description's."""
    return {k: (v[0] if isinstance(v, list) and v and isinstance(v[0], int) else v) for k, v in cfg.items()}


def _layer_caches(cfg: dict[str, Any], num_layers: int, dtype_bytes: int, path: Path) -> tuple[LayerCache, ...]:
    """kv.layer_caches, with a config that lacks (or garbles) a key its family's rule needs
    reported as this module's error rather than a KeyError from deep inside."""
    try:
        return layer_caches(cfg, num_layers, dtype_bytes)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ModelDescriptionError(f"{path}: cannot tell what each layer caches ({detail})") from None


def _ranges(indices: list[int]) -> str:
    """'1-3, 7' for [1, 2, 3, 7]: short messages for long lists."""
    out: list[str] = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(out)

