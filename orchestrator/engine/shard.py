"""A stage's slice of the model: load only its layers, and run them exactly as mlx-lm does.

The forward pass mirrors `mlx_lm.models.llama.LlamaModel.__call__` (embed → mask from the
first cache → layers → norm → head) so that greedy output through any split is bit-for-bit
the single-process result. Decode steps of several requests can run as one micro-batch:
projections and MLP batched, attention per request against its own KV cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask, scaled_dot_product_attention
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model

# Families whose decoder layer is the Llama block (q/k/v/o projections, RoPE, SwiGLU MLP):
# they run the batched decode path. Others run one request at a time, still exactly.
BATCHABLE_TYPES = {"llama", "mistral"}


class ShardError(RuntimeError):
    """The model cannot be split as asked (bad range, unsupported layout)."""


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know about a model directory without loading weights."""

    model_type: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    tied: bool
    max_position_embeddings: int | None

    @classmethod
    def read(cls, model_dir: Path) -> "ModelInfo":
        """Read config.json; raises ShardError when it is missing or not a decoder LM."""
        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text())
            return cls(
                model_type=cfg["model_type"],
                num_layers=int(cfg["num_hidden_layers"]),
                hidden_size=int(cfg["hidden_size"]),
                vocab_size=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", True)),
                max_position_embeddings=cfg.get("max_position_embeddings"),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ShardError(f"{model_dir}: not a usable MLX model directory ({exc})") from None


class StageModel:
    """Layers [start, end) of a model, plus embedding (first stage) and norm/head (last)."""

    def __init__(self, model_dir: Path, start: int, end: int) -> None:
        self.info = ModelInfo.read(model_dir)
        if not 0 <= start < end <= self.info.num_layers:
            raise ShardError(f"layers {start}-{end - 1} outside the model's 0-{self.info.num_layers - 1}")
        self.start, self.end = start, end
        self.first = start == 0
        self.last = end == self.info.num_layers
        model, _ = load_model(Path(model_dir), lazy=True)
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "embed_tokens"):
            raise ShardError(f"model_type {self.info.model_type!r} does not have the Llama layout")
        # Prune before evaluating: lazily-loaded tensors we drop are never read from disk.
        self.layers = list(inner.layers[start:end])
        inner.layers = [None] * start + self.layers
        self.embed = inner.embed_tokens if (self.first or (self.last and self.info.tied)) else None
        self.norm = inner.norm if self.last else None
        self.head = getattr(model, "lm_head", None) if (self.last and not self.info.tied) else None
        if not (self.first or (self.last and self.info.tied)):
            del inner.embed_tokens
        if not self.last:
            del inner.norm
            if hasattr(model, "lm_head"):
                del model.lm_head
        self._model = model
        mx.eval(model.parameters())
        self.dtype = self._param_dtype()
        self.batchable = self.info.model_type in BATCHABLE_TYPES and all(_is_llama_block(l) for l in self.layers)

    @property
    def layer_range(self) -> tuple[int, int]:
        """Half-open (start, end) of the layers this stage runs."""
        return self.start, self.end

    def _param_dtype(self) -> mx.Dtype:
        norm_weight = self.layers[0].input_layernorm.weight
        return norm_weight.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of the parameters this stage holds."""
        return sum(v.nbytes for _, v in nn.utils.tree_flatten(self._model.parameters()))

    def make_cache(self) -> list[Any]:
        """A fresh KV cache for this stage's layers (one request)."""
        return [KVCache() for _ in self.layers]

    def run_layers(self, x: mx.array, cache: list[Any]) -> mx.array:
        """Embed (first stage) and run this stage's layers over one request's [1, L] tokens or [1, L, H] hidden."""
        h = self.embed(x) if self.first else x
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, cache=c)
        return h

    def logprobs(self, h: mx.array) -> mx.array:
        """Last stage: norm, head, last position, log-softmax, as `generate_step` computes them: [1, V]."""
        logits = self._head(self.norm(h))[:, -1, :]
        return logits - mx.logsumexp(logits, keepdims=True)

    def logprobs_rows(self, hs: list[mx.array]) -> list[mx.array]:
        """`logprobs` of several requests in one head GEMM: a [1, V] array per request, each equal
        to `logprobs(h)` of that request (the head and the norm work row by row)."""
        h = mx.concatenate([x[:, -1:, :] for x in hs], axis=0)  # [B, 1, H]
        logits = self._head(self.norm(h))[:, -1, :]
        lps = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return [lps[b:b + 1] for b in range(len(hs))]

    def _head(self, h: mx.array) -> mx.array:
        return self.embed.as_linear(h) if self.head is None else self.head(h)

    def run_layers_batch(self, xs: list[mx.array], caches: list[list[Any]]) -> list[mx.array]:
        """One decode step (L=1) for several requests at once; each row equals its solo result."""
        h = mx.concatenate([self.embed(x) if self.first else x for x in xs], axis=0)  # [B, 1, H]
        for i, layer in enumerate(self.layers):
            h = _block_batch(layer, h, [c[i] for c in caches])
        return [h[b:b + 1] for b in range(h.shape[0])]


def _is_llama_block(layer: nn.Module) -> bool:
    attn = getattr(layer, "self_attn", None)
    return (
        attn is not None
        and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj", "rope", "n_heads", "n_kv_heads", "scale"))
        and not hasattr(attn, "q_norm")
        and hasattr(layer, "mlp") and hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")
    )


def _block_batch(layer: nn.Module, x: mx.array, caches: list[Any]) -> mx.array:
    """The Llama TransformerBlock for B single-token rows, each attending to its own cache."""
    attn = layer.self_attn
    r = layer.input_layernorm(x)
    q, k, v = attn.q_proj(r), attn.k_proj(r), attn.v_proj(r)
    outs = []
    for b, cache in enumerate(caches):
        qb = q[b:b + 1].reshape(1, 1, attn.n_heads, -1).transpose(0, 2, 1, 3)
        kb = k[b:b + 1].reshape(1, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        vb = v[b:b + 1].reshape(1, 1, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
        qb = attn.rope(qb, offset=cache.offset)
        kb = attn.rope(kb, offset=cache.offset)
        kb, vb = cache.update_and_fetch(kb, vb)
        o = scaled_dot_product_attention(qb, kb, vb, cache=cache, scale=attn.scale, mask=None)
        outs.append(o.transpose(0, 2, 1, 3).reshape(1, 1, -1))
    h = x + attn.o_proj(mx.concatenate(outs, axis=0))
    return h + layer.mlp(layer.post_attention_layernorm(h))
