"""Which models one timing of layers stands for on one node (issue 41 item 3): the reuse key.

A node's timing of a model's layers (engine/profiling/layers.py) depends on what each layer
computes and on what computes it, not on the model's name: two models of one family with the
same layer shapes, dtype and quantization, on the same backend, time alike (a fine-tune and its
base; the same weights imported twice). The node agent keeps its timings under this key
(agent/compute.py) and answers a model it has not timed with the timing of one that shares
the key; any part that differs gives another key, so the model is timed afresh.

The key's parts, each read without loading a weight:
- family: the decoder's model_type;
- shape: the decoder's sizes (hidden, heads, KV heads, head_dim, intermediate, experts, ...),
  the layer kinds' shares (families/layer_kinds.py: every tensor of a layer by name, dtype
  and shape, and the config's per-layer pattern), and the embedding and head tensors;
- dtype: the config's dtype and quantization;
- backend: what the caller says computes it (mlx and its device, the BLAS, its threads, the
  CPUs, the profile's version; agent/compute.timing_backend).

Pure: the caller reads the config and the headers.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from orchestrator.families.decoder_config import decoder_view, layer_count
from orchestrator.families.layer_kinds import LAYER, Tensors, layer_kinds

# The decoder's sizes a layer's cost follows beyond its weights' shapes (heads split a
# projection of one shape in several ways; experts per token decide what a token computes).
SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                "moe_intermediate_size", "num_experts", "num_local_experts", "n_routed_experts",
                "num_experts_per_tok", "n_shared_experts", "kv_lora_rank", "q_lora_rank", "sliding_window",
                "vocab_size", "tie_word_embeddings")
DTYPE_FIELDS = ("torch_dtype", "dtype", "quantization", "quantization_config")
SHARE_DIGITS = 4  # a kind's share of the layers, rounded: 1/3 of 30 layers and of 60 are one share


def timing_parts(config: Mapping[str, Any], tensors: Tensors, backend: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of the reuse key of a model (its config.json and safetensors headers) timed on
    `backend` (pure): family, shape, dtype and backend, as JSON-ready values."""
    view = decoder_view(dict(config))
    count = layer_count(view) or 1 + max((int(m.group(1)) for n in tensors if (m := LAYER.search(n))), default=-1)
    kinds = Counter(layer_kinds(tensors, config, count)) if count > 0 else Counter()
    outside = sorted(f"{name}:{dtype}:{'x'.join(map(str, shape))}" for name, (dtype, shape) in tensors.items()
                     if not LAYER.search(name))
    return {
        "family": str(view.get("model_type", "")),
        "shape": {**{k: view[k] for k in SHAPE_FIELDS if k in view},
                  "layer_kinds": {k: round(c / count, SHARE_DIGITS) for k, c in sorted(kinds.items())},
                  "outside_layers": _digest(outside)},
        "dtype": {k: view[k] for k in DTYPE_FIELDS if k in view},
        "backend": dict(backend),
    }


def timing_key(parts: Mapping[str, Any]) -> str:
    """A file-name-safe digest of `timing_parts` (equal parts, equal key)."""
    return _digest(parts)[:32]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
