"""A stage's slice of the model: load only its layers, and run them with the family's own code.

The stage builds the family's mlx-lm `Model`, lazily, and replaces what it does not own
with the stand-ins of `stubs.py` before anything is read from disk. Every forward is the
family's own `Model.__call__` over the whole (mostly skipped) layer list, with the
family's own `make_cache()`: embedding scale, sliding-window and chunked masks built at
global layer indices, per-layer cache types, final norm, head and soft-capping are all the
family's code, so greedy output through any split is bit-for-bit the single-process result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_model

from . import support
from .batch import (BatchUnavailable, RowCaches, RowStates, batch_caches, batch_parts, install_row_attention, restore,
                    snapshot, split_attention_by_row)
from .stubs import Entry, Exit, Hollow, Skip


class ShardError(RuntimeError):
    """The model cannot be split as asked (bad range, unsupported family or layout)."""


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
            cfg = {**cfg, **cfg.get("text_config", {})}  # multimodal layouts nest the decoder's config
            return cls(
                model_type=cfg["model_type"],
                num_layers=layer_count(cfg),
                hidden_size=int(cfg["hidden_size"]),
                vocab_size=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", True)),
                max_position_embeddings=cfg.get("max_position_embeddings"),
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ShardError(f"{model_dir}: not a usable MLX model directory ({exc})") from None


def layer_count(cfg: dict[str, Any]) -> int:
    """Decoder layers per config.json; hybrid families may give only their per-layer pattern
    (LongCat-Flash calls the count num_layers)."""
    for key in ("num_hidden_layers", "num_layers"):
        if cfg.get(key) is not None:
            return int(cfg[key])
    for key in ("hybrid_override_pattern", "layers_block_type", "layer_types"):
        if isinstance(cfg.get(key), (list, str)):
            return len(cfg[key])
    raise KeyError("num_hidden_layers")


def read_config(model_dir: Path) -> dict[str, Any]:
    """config.json as a dict; ShardError when unreadable."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ShardError(f"{model_dir}: not a usable MLX model directory ({exc})") from None
    if not isinstance(cfg, dict):
        raise ShardError(f"{model_dir}: config.json is not an object")
    return cfg


class StageModel:
    """Layers [start, end) of a model, plus the embedding (first stage) and norm/head (last)."""

    def __init__(self, model_dir: Path, start: int, end: int) -> None:
        config = read_config(model_dir)
        reason = support.unsupported_reason(config)
        if reason:
            raise ShardError(f"cannot serve this model exactly: {reason}")
        self.info = ModelInfo.read(model_dir)
        if not 0 <= start < end <= self.info.num_layers:
            raise ShardError(f"layers {start}-{end - 1} outside the model's 0-{self.info.num_layers - 1}")
        self.start, self.end = start, end
        self.first = start == 0
        self.last = end == self.info.num_layers
        model, _ = load_model(Path(model_dir), lazy=True)
        layers = _layer_list(model)
        if len(layers) != self.info.num_layers:
            raise ShardError(f"the model has {len(layers)} layers, config.json says {self.info.num_layers}")
        self.dtype = _activation_dtype(model, layers[start])
        # Prune before evaluating: lazily-loaded tensors we drop are never read from disk.
        for i in [*range(start), *range(end, len(layers))]:
            layers[i] = Skip(layers[i])
        row_attention = support.ROW_ATTENTION.get(support.family_of(config) or "")
        if row_attention:
            for layer in layers[start:end]:
                split_attention_by_row(layer, row_attention)
        self._entry = None if self.first else Entry(layers[start])
        if self._entry is not None:
            layers[start] = self._entry
        self._exit = None if self.last else Exit(layers[end - 1])
        if self._exit is not None:
            layers[end - 1] = self._exit
        _hollow_ends(model, first=self.first, last=self.last, hidden=self.info.hidden_size, dtype=self.dtype)
        self._model = model
        mx.eval(model.parameters())
        install_row_attention()
        # Decode steps of several requests run as one forward until a step shows the family
        # cannot be batched exactly (batch.py); then one request at a time, still exact.
        self.batchable = True
        self.batch_refusal: str | None = None

    @property
    def layer_range(self) -> tuple[int, int]:
        """Half-open (start, end) of the layers this stage runs."""
        return self.start, self.end

    @property
    def weight_bytes(self) -> int:
        """Bytes of the parameters this stage holds."""
        return sum(v.nbytes for _, v in nn.utils.tree_flatten(self._model.parameters()))

    def make_cache(self) -> list[Any]:
        """A fresh cache for one request: the family's own `make_cache()`, whole model long.

        Entries of skipped layers only count positions (zero-width keys); they keep the masks
        a family builds from a particular layer's cache right at any split point.
        """
        if hasattr(self._model, "make_cache"):
            return self._model.make_cache()
        return [KVCache() for _ in range(self.info.num_layers)]

    def forward(self, x: mx.array, cache: list[Any]) -> mx.array:
        """Run the family's forward for one request.

        `x` is [1, L] token ids on the first stage, [1, L, H] hidden states elsewhere. Returns
        the hidden state after this stage's last layer, or on the last stage the logits
        [1, L, V] (lazy: a prefill chunk evaluates only the caches, never the head).
        """
        if self._entry is not None:
            self._entry.feed(x)
            x = mx.zeros(x.shape[:2], mx.int32)  # token ids the embedding stand-in turns into zeros
        out = self._model(x, cache=cache)
        return out if self._exit is None else self._exit.take()

    def forward_batch(self, xs: list[mx.array], caches: list[list[Any]]) -> list[mx.array]:
        """One decode step (L=1) for several requests that have each seen at least one token.

        Returns what `forward` returns for each request, bit for bit: one batched forward when
        the family allows it (batch.py), otherwise (or after a refused step, with every cache
        restored) one forward per request.
        """
        if self.batchable:
            saved = snapshot(caches)
            try:
                return self._forward_rows(xs, caches)
            except Exception as exc:  # nothing was evaluated: restore and run the rows one by one
                restore(caches, saved)
                self.batchable, self.batch_refusal = False, f"{type(exc).__name__}: {exc}"
        return [self.forward(x, c) for x, c in zip(xs, caches)]

    def _forward_rows(self, xs: list[mx.array], caches: list[list[Any]]) -> list[mx.array]:
        rows = batch_caches(caches)
        out = self.forward(mx.concatenate(xs, axis=0), rows)
        parts = batch_parts(rows)
        if not all(r.consumed() for r in parts if isinstance(r, RowCaches)):
            raise BatchUnavailable("the family's attention does not go through mlx-lm's shared attention")
        for r in parts:
            if isinstance(r, RowStates):
                r.write_back()
        return [out[b:b + 1] for b in range(len(xs))]

    def logprobs(self, logits: mx.array) -> mx.array:
        """Last stage: the last position's log-softmax, as `generate_step` computes it: [1, V]."""
        last = logits[:, -1, :]
        return last - mx.logsumexp(last, keepdims=True)


def _layer_list(model: nn.Module) -> list[nn.Module]:
    """The model's own list object holding its decoder layers (edited in place)."""
    try:
        layers = model.layers
    except AttributeError:
        raise ShardError(f"{type(model).__module__} has no layer list") from None
    if not layers:
        raise ShardError("the model has no layers")
    target = layers[0]
    for _, module in model.named_modules():
        for value in module.values():
            if isinstance(value, list) and len(value) == len(layers) and value and value[0] is target:
                return value
    raise ShardError(f"{type(model).__module__}: cannot locate the layer list to split")


def _activation_dtype(model: nn.Module, layer: nn.Module) -> mx.Dtype:
    """The dtype hidden states have between layers: the layer's first floating, non-scale tensor."""
    for name, value in nn.utils.tree_flatten(layer.parameters()):
        if mx.issubdtype(value.dtype, mx.floating) and not name.endswith(("scales", "biases")):
            return value.dtype
    for name, value in nn.utils.tree_flatten(layer.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype
    return mx.float32


def _hollow_ends(model: nn.Module, *, first: bool, last: bool, hidden: int, dtype: mx.Dtype) -> None:
    """Replace the embedding / final norm / head the stage does not own by weightless stand-ins.

    Outside the layer list: embeddings belong to the first stage (and the last when the head
    is tied to them, i.e. there is no separate output projection); linear heads and norms to
    the last. Anything else (rare, small) stays on every stage.
    """
    parts = _outer_parts(model)
    tied = not any(role == "head" for role, _, _ in parts)
    for role, parent, key in parts:
        keep = {"embedding": first or (last and tied), "head": last, "norm": last}.get(role, True)
        if not keep:
            parent[key] = Hollow(role, hidden, dtype)


def _outer_parts(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(role, parent, key) of each top-level part with weights outside the layer list."""
    layers = _layer_list(model)
    found: list[tuple[str, nn.Module, str]] = []

    def visit(module: nn.Module) -> None:
        for key, value in module.items():
            if value is layers or not isinstance(value, nn.Module):
                continue
            role = _role(value)
            if role is None:
                visit(value)
            else:
                found.append((role, module, key))

    visit(model)
    return found


def _role(module: nn.Module) -> str | None:
    if isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)):
        return "embedding"
    if isinstance(module, (nn.Linear, nn.QuantizedLinear)):
        return "head"
    if "norm" in type(module).__name__.lower():
        return "norm"
    if any(isinstance(v, mx.array) for k, v in module.items() if not k.startswith("_")):
        return "other"
    return None
