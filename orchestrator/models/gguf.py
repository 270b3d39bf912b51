"""Convert a llama-architecture GGUF file into an mlx-lm model directory.

`mx.load` reads GGUF, but not in the shape mlx-lm wants:

- Q4_0, Q4_1 and Q8_0 tensors come back as mlx quantized triplets: `NAME.weight` (uint32,
  packed), `NAME.scales` and `NAME.biases` (float16), with group size 32 (the GGUF block).
  The bit width is not given anywhere; it follows from the shapes (packed columns per
  group). The quant type is per tensor: SmolLM2's Q4_1 file stores the embedding as Q8_0.
  Here every tensor is dequantized (in float32, then cast) so the result is a plain model.
- Metadata values are mx.array scalars (numbers, booleans) or Python lists (strings).
- llama.cpp permutes the rows of Q and K for interleaved RoPE, so the model needs
  `rope_traditional: true` (mlx-lm honours it).
- The tokenizer is only a vocabulary, merges and token types; tokenizer.json is rebuilt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from orchestrator.models.files import mx_dtype

# progress(step, done, total): called as work advances; see demo.import_demo_model.
Progress = Callable[[str, int, int], None]

GGUF_GROUP_SIZE = 32  # block size of Q4_0, Q4_1 and Q8_0

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)$")

# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_NORMAL, _TOKEN_CONTROL, _TOKEN_USER_DEFINED = 1, 3, 4


def load_gguf(path: str | Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read a GGUF file; metadata scalars become Python values, arrays stay mx arrays."""
    tensors, raw = mx.load(str(path), return_metadata=True)
    metadata: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, mx.array) and value.ndim == 0:
            value = value.item()
        metadata[key] = value
    return tensors, metadata


def llama_name(gguf_name: str) -> str:
    """Map a GGUF tensor base name (no `.weight`) to its mlx-lm Llama module path."""
    match = _BLOCK.match(gguf_name)
    if match:
        layer, part = match.groups()
        if part in _LAYER_NAMES:
            return f"model.layers.{layer}.{_LAYER_NAMES[part]}"
    elif gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}")


def _f32(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def llama_config(metadata: Mapping[str, Any], tensors: Mapping[str, mx.array]) -> dict[str, Any]:
    """Build an mlx-lm / HF Llama config.json from GGUF metadata."""
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"only llama GGUF files are supported, not {arch!r}")
    if any(key.startswith("llama.rope.scaling") for key in metadata):
        raise ValueError("GGUF rope scaling is not supported")
    hidden = int(metadata["llama.embedding_length"])
    heads = int(metadata["llama.attention.head_count"])
    vocab = int(metadata.get("llama.vocab_size", len(metadata["tokenizer.ggml.tokens"])))
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(metadata["llama.block_count"]),
        "intermediate_size": int(metadata["llama.feed_forward_length"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(metadata.get("llama.attention.head_count_kv", heads)),
        "head_dim": int(metadata.get("llama.attention.key_length", hidden // heads)),
        "hidden_act": "silu",
        "rms_norm_eps": _f32(metadata["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _f32(metadata.get("llama.rope.freq_base", 10000.0)),
        # llama.cpp stores Q and K permuted for interleaved ("traditional") RoPE.
        "rope_traditional": True,
        "max_position_embeddings": int(metadata.get("llama.context_length", 2048)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "mlp_bias": False,
    }
    for key, name in (("bos_token_id", "bos"), ("eos_token_id", "eos"), ("pad_token_id", "padding")):
        if f"tokenizer.ggml.{name}_token_id" in metadata:
            config[key] = int(metadata[f"tokenizer.ggml.{name}_token_id"])
    return config


def dequantize(tensors: Mapping[str, mx.array], base: str, dtype: mx.Dtype) -> mx.array:
    """Return tensor `base` (name without `.weight`) as a plain `dtype` array.

    Quantized tensors are expanded in float32 (scale * q + bias, as llama.cpp computes
    it) and cast once, so float32 output is exact and lower precisions are rounded once.
    """
    weight = tensors[f"{base}.weight"]
    scales = tensors.get(f"{base}.scales")
    if scales is None:
        return weight.astype(dtype)
    biases = tensors[f"{base}.biases"]
    packed, groups = weight.shape[-1], scales.shape[-1]
    bits, rest = divmod(packed, groups)  # packed uint32 columns = groups * 32 * bits / 32
    if rest or bits not in (2, 3, 4, 5, 6, 8):
        raise ValueError(f"cannot infer quantization of {base}: {packed} packed columns, {groups} groups")
    values = mx.dequantize(
        weight, scales.astype(mx.float32), biases.astype(mx.float32), group_size=GGUF_GROUP_SIZE, bits=bits
    )
    return values.astype(dtype)


def convert_tensors(
    tensors: Mapping[str, mx.array], dtype: str, progress: Progress | None = None
) -> dict[str, mx.array]:
    """Dequantize and rename every GGUF tensor; evaluated one by one to bound memory."""
    target = mx_dtype(dtype)
    bases = sorted({name.rsplit(".", 1)[0] for name in tensors})
    out: dict[str, mx.array] = {}
    for done, base in enumerate(bases, 1):
        array = dequantize(tensors, base, target)
        mx.eval(array)
        out[f"{llama_name(base)}.weight"] = array
        if progress:
            progress("convert", done, len(bases))
    return out


def _pre_tokenizer(kind: str) -> pre_tokenizers.PreTokenizer:
    """The pre-tokenizer for llama.cpp's `tokenizer.ggml.pre` value."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind == "smollm":
        # llama.cpp's SMOLLM pre-tokenizer: every digit alone, then the GPT-2 regex.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if kind in ("gpt2", "default"):
        return byte_level
    raise ValueError(f"unsupported GGUF pre-tokenizer {kind!r}")


def build_tokenizer(metadata: Mapping[str, Any]) -> Tokenizer:
    """Rebuild a byte-level BPE `tokenizers.Tokenizer` from GGUF vocabulary and merges.

    Control tokens (type 3) become special added tokens so that `<|im_start|>` in a chat is
    one token and is hidden when decoding with skip_special_tokens; user-defined tokens
    (type 4) are added but not special.
    """
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"only byte-level BPE (gpt2) GGUF tokenizers are supported, not {kind!r}")
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    types = metadata.get("tokenizer.ggml.token_type")
    types = np.array(types).tolist() if types is not None else [_TOKEN_NORMAL] * len(tokens)
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre", "default"))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    # Already in the vocabulary, so they keep their ids.
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _TOKEN_USER_DEFINED]
    )
    return tokenizer


def special_token(metadata: Mapping[str, Any], name: str) -> str | None:
    """The text of special token `name` (bos, eos, padding, unknown), if the GGUF names one."""
    key = f"tokenizer.ggml.{name}_token_id"
    if key not in metadata:
        return None
    return metadata["tokenizer.ggml.tokens"][int(metadata[key])]
