"""Where a model's parts are, for a stage to keep or hollow them: its decoder layer list (one list,
or AFM's two seen as one), the parts outside it (embedding, norms, head, per-layer-input parts) and
the dtype hidden states have between its layers."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from orchestrator.engine.stage.stand_ins import Hollow


class ShardError(RuntimeError):
    """The model cannot be split as asked (bad range, unsupported family or layout)."""


class LayerLists(list):
    """Two layer lists of a model seen as one, in the order of the model's `layers` (AFM: its
    `model.layers`, then its KV-reuse layers `model.kv_reuse_layers`): item assignment writes
    through to the list holding that layer, so the model's own code runs the stand-ins."""

    def __init__(self, parts: list[list[nn.Module]]) -> None:
        super().__init__(layer for part in parts for layer in part)
        self.parts = parts

    def __setitem__(self, index: Any, value: Any) -> None:
        if not isinstance(index, int):
            raise TypeError("layers are replaced one at a time")
        i = range(len(self))[index]  # IndexError as a list gives it; a negative index counts from the end
        super().__setitem__(i, value)
        for part in self.parts:
            if i < len(part):
                part[i] = value
                return
            i -= len(part)


def layer_list(model: nn.Module) -> list[nn.Module]:
    """The model's own list object holding its decoder layers (edited in place), or, where its
    `layers` joins two lists (AFM's KV-reuse layers), a `LayerLists` writing through to both."""
    try:
        layers = model.layers
    except AttributeError:
        raise ShardError(f"{type(model).__module__} has no layer list") from None
    if not layers:
        raise ShardError("the model has no layers")
    lists = [value for _, module in model.named_modules() for value in module.values()
             if isinstance(value, list) and value and isinstance(value[0], nn.Module)]
    for value in lists:
        if len(value) == len(layers) and value[0] is layers[0]:
            return value
    # Two lists that together are the model's layers, in order.
    for head in lists:
        rest = len(layers) - len(head)
        if 0 < rest and all(a is b for a, b in zip(head, layers)):
            for tail in lists:
                if len(tail) == rest and all(a is b for a, b in zip(tail, layers[len(head):])):
                    return LayerLists([head, tail])
    raise ShardError(f"{type(model).__module__}: cannot locate the layer list to split")


def activation_dtype(model: nn.Module, layer: nn.Module, cast: Any = None) -> mx.Dtype:
    """The dtype hidden states have between layers: the layer's first floating, non-scale tensor
    that conversion casts (`cast`: the family's cast_predicate; DeepSeek-V4.1 keeps its
    hyper-connections in float32 whatever the model's dtype)."""
    for name, value in nn.utils.tree_flatten(layer.parameters()):
        if mx.issubdtype(value.dtype, mx.floating) and not name.endswith(("scales", "biases")) \
                and (cast is None or cast(name)):
            return value.dtype
    for _name, value in nn.utils.tree_flatten(layer.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            return value.dtype
    return mx.float32


def hollow_ends(model: nn.Module, *, first: bool, last: bool, hidden: int, dtype: mx.Dtype,
                 per_layer: tuple[tuple[str, ...], int] = ((), 0), kept: tuple[str, ...] = ()) -> None:
    """Replace the embedding / final norm / head the stage does not own by weightless stand-ins.

    Outside the layer list: embeddings belong to the first stage (and the last when the head
    is tied to them, i.e. there is no separate output projection); linear heads and norms to
    the last. Anything else (rare, small) stays on every stage. The parts that compute per-layer
    inputs (`per_layer`: their keys and output width) belong to the first stage; elsewhere they
    yield zeros of that width, which no layer reads (each takes the received inputs instead).
    The parts named in `kept` stay on every stage (support.KEPT_EVERYWHERE).
    """
    keys, width = per_layer
    parts = [p for p in _outer_parts(model) if p[2] not in keys and p[2] not in kept]
    if not first:
        for role, parent, key in _outer_parts(model):
            if key in keys:
                parent[key] = Hollow({"head": "projection"}.get(role, role), width, dtype)
    # A head kept as a bare matrix (Talkie's `lm_head`, no Linear around it): not the embedding's tie.
    bare_head = isinstance(model.get("lm_head"), mx.array)
    if bare_head and not last:
        model["lm_head"] = mx.zeros((0, hidden), dtype)  # its product is never evaluated here: no weights read
    tied = not bare_head and not any(role == "head" for role, _, _ in parts)
    for role, parent, key in parts:
        keep = {"embedding": first or (last and tied), "head": last, "norm": last}.get(role, True)
        if not keep:
            parent[key] = Hollow(role, hidden, dtype)


def _outer_parts(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(role, parent, key) of each top-level part with weights outside the layer list."""
    layers = layer_list(model)
    found: list[tuple[str, nn.Module, str]] = []

    def visit(module: nn.Module) -> None:
        for key, value in module.items():
            if value is layers or any(value is part for part in getattr(layers, "parts", ())) \
                    or not isinstance(value, nn.Module):
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
